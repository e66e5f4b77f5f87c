"""The groups the roles are (core.scoping.ROLE_GROUPS): a fresh install has both, as the docs name them."""
from django.db import migrations

ROLE_GROUPS = ("operators", "auditors")  # a copy: migrations do not import the code that may change


def groups_make(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ROLE_GROUPS:
        Group.objects.get_or_create(name=name)


class Migration(migrations.Migration):
    dependencies = [("pools", "0013_membership_role"), ("auth", "0012_alter_user_first_name_max_length")]
    operations = [migrations.RunPython(groups_make, migrations.RunPython.noop)]
