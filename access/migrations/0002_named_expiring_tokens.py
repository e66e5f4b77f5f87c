# Several named tokens per user, each with an expiry and a scope. The tokens made before keep working: they were
# hashed already; each gets the name "token", read-write, and the default lifetime from now on.
import datetime

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone


def name_and_date_existing(apps, schema_editor):
    from access.durations import parse_duration

    ApiToken = apps.get_model("vmetal_api", "ApiToken")
    expires_at = timezone.now() + datetime.timedelta(seconds=parse_duration(settings.API_TOKEN_EXPIRES_DEFAULT))
    ApiToken.objects.update(name="token", expires_at=expires_at)


class Migration(migrations.Migration):

    dependencies = [
        ("pools", "0011_node_type_health_tiers"),
        ("vmetal_api", "0001_api_token"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name="apitoken",
            name="user",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="api_tokens",
                                    to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="name",
            field=models.CharField(default="token", help_text="what the token is for; one name per user",
                                   max_length=64),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="apitoken",
            name="read_only",
            field=models.BooleanField(default=False, help_text="GET, HEAD and OPTIONS only"),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="tenants",
            field=models.ManyToManyField(blank=True, help_text="only these of the user's tenants; none: all the user may see",
                                         related_name="+", to="pools.tenant"),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="last_used_at",
            field=models.DateTimeField(blank=True, help_text="recorded at most once a minute", null=True),
        ),
        migrations.RunPython(name_and_date_existing, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(),
        ),
        migrations.AddConstraint(
            model_name="apitoken",
            constraint=models.UniqueConstraint(fields=("user", "name"), name="api_token_name_per_user"),
        ),
    ]
