
import uuid

from django.db import migrations, models


def first_epoch(apps, schema_editor):
    apps.get_model("hosts", "WorldEpoch").objects.create(epoch=uuid.uuid4().hex)


class Migration(migrations.Migration):

    dependencies = [
        ('hosts', '0013_agentsession_address'),
    ]

    operations = [
        migrations.CreateModel(
            name='WorldEpoch',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('epoch', models.CharField(max_length=64)),
                ('changed_at', models.DateTimeField(auto_now=True)),
            ],
        ),
        migrations.AddField(
            model_name='baremetalhost',
            name='held_from',
            field=models.CharField(blank=True, choices=[('registering', 'Registering'), ('inspecting', 'Inspecting'), ('available', 'Available'), ('checking', 'Idle check'), ('provisioning', 'Provisioning'), ('provisioned', 'Provisioned'), ('deprovisioning', 'Deprovisioning'), ('repair', 'Repair'), ('retesting', 'Retesting'), ('repairing', 'Repairing'), ('retired', 'Retired'), ('error', 'Error'), ('maintenance', 'Maintenance'), ('held', 'Held: reconciling after a restore')], max_length=16),
        ),
        migrations.AlterField(
            model_name='baremetalhost',
            name='state',
            field=models.CharField(choices=[('registering', 'Registering'), ('inspecting', 'Inspecting'), ('available', 'Available'), ('checking', 'Idle check'), ('provisioning', 'Provisioning'), ('provisioned', 'Provisioned'), ('deprovisioning', 'Deprovisioning'), ('repair', 'Repair'), ('retesting', 'Retesting'), ('repairing', 'Repairing'), ('retired', 'Retired'), ('error', 'Error'), ('maintenance', 'Maintenance'), ('held', 'Held: reconciling after a restore')], db_index=True, default='registering', max_length=16),
        ),
        migrations.RunPython(first_epoch, migrations.RunPython.noop),
    ]
