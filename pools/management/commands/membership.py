"""python manage.py membership {add,remove} USER TENANT [--role admin|viewer] [--actor A]"""
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError

from events.services import cli_actor
from pools.models import Tenant, TenantMembership
from pools.services import membership_add, membership_remove


class Command(BaseCommand):
    help = ("Make a user a member of a tenant, its admin (sees and changes its pools, claims and nodes) or its "
            "viewer (sees them), or end that. Recorded in the Event log. Platform admins, operators and auditors "
            "are not members: they are staff, or in the operators or auditors group (manage.py user, the user "
            "admin).")

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["add", "remove"])
        parser.add_argument("user", help="username")
        parser.add_argument("tenant", help="tenant name")
        parser.add_argument("--role", choices=TenantMembership.Role.values, default=TenantMembership.Role.ADMIN,
                            help="admin (default) or viewer")
        parser.add_argument("--actor", help="who to name in the Event log (default: cli:<login name>)")

    def handle(self, *args, action, user, tenant, actor, role, **options):
        member = User.objects.filter(username=user).first()
        if member is None:
            raise CommandError(f"no user {user!r}")
        found = Tenant.objects.filter(name=tenant).first()
        if found is None:
            raise CommandError(f"no tenant {tenant!r}")
        actor = actor or cli_actor()
        if action == "add":
            done = membership_add(tenant=found, user=member, actor=actor, role=role)
            what = f"a tenant {role}"
            self.stdout.write(f"{user} is now {what} of {tenant}" if done else f"{user} was already {what} of {tenant}")
        else:
            done = membership_remove(tenant=found, user=member, actor=actor)
            self.stdout.write(f"{user} is no longer a member of {tenant}" if done else f"{user} was not a member of {tenant}")
