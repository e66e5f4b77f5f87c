"""python manage.py user create NAME --role ROLE [--tenant T ...] [--password-stdin]"""
import sys

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from access.roles import ROLES, TENANT_ROLES, user_create
from events.services import cli_actor


class Command(BaseCommand):
    help = ("Person users, who sign in to the console with a password: `create NAME --role ROLE` makes one and "
            "prints a new password once, or reads it from standard input with --password-stdin (never from the "
            "command line, where other users of the machine see it). Recorded in the Event log.")

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="make a person user in a role")
        create.add_argument("name")
        create.add_argument("--role", required=True, choices=ROLES,
                            help="admin, operator or auditor (the platform's); tenant-admin or tenant-viewer "
                                 "(of the --tenant given)")
        create.add_argument("--tenant", action="append", default=[],
                            help=f"for {' and '.join(TENANT_ROLES)}: a tenant (repeat for more)")
        create.add_argument("--password-stdin", action="store_true",
                            help="read the password from standard input (its first line) rather than make one")

    def handle(self, *args, action, name, role, tenant, password_stdin, **options):
        password = None
        if password_stdin:
            password = sys.stdin.readline().rstrip("\r\n")
            if not password:
                raise CommandError("--password-stdin: standard input holds no password")
        try:
            user, made = user_create(username=name, role=role, tenant_names=tenant, password=password,
                                     actor=cli_actor())
        except ValidationError as error:
            raise CommandError("; ".join(error.messages)) from None
        roles = f"{role} of {', '.join(tenant)}" if tenant else role
        self.stdout.write(f"user {user.username} made ({roles})")
        if made:
            self.stdout.write(f"password: {made}")
            self.stdout.write("(shown this once; change it in the admin or with manage.py changepassword)")
