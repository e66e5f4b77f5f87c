"""python manage.py token create USER [--service-user ROLE [--tenant T]] | token revoke PREFIX"""
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from access.selectors import token_by_prefix
from access.services import SERVICE_ROLES, service_user_create, token_create, token_revoke
from events.services import cli_actor


class Command(BaseCommand):
    help = ("API tokens for automation: `create USER` makes USER a new token (replacing any earlier one) and "
            "prints its key, this once; `revoke PREFIX` revokes the token with that prefix. Both go in the "
            "Event log.")

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="make USER a new token and print its key")
        create.add_argument("user")
        create.add_argument("--service-user", choices=SERVICE_ROLES, metavar="{" + ",".join(SERVICE_ROLES) + "}",
                            help="make USER first when missing, a user with no password in this role (an "
                                 "existing USER must have it)")
        create.add_argument("--tenant", help="the tenant a --service-user member belongs to")
        actions.add_parser("revoke", help="revoke the token with this prefix").add_argument("prefix")

    def handle(self, *args, action, **options):
        actor = cli_actor()
        if action == "create":
            if options["service_user"]:
                try:
                    user = service_user_create(username=options["user"], role=options["service_user"],
                                               tenant_name=options["tenant"], actor=actor)
                except ValidationError as error:
                    raise CommandError("; ".join(error.messages)) from None
            else:
                if options["tenant"]:
                    raise CommandError("--tenant goes with --service-user member")
                user = get_user_model().objects.filter(username=options["user"]).first()
                if user is None:
                    raise CommandError(f"no user {options['user']!r} (--service-user admin|auditor|member makes "
                                       "one for automation)")
            _, key = token_create(user=user, actor=actor)
            self.stdout.write(key)
        else:
            token = token_by_prefix(options["prefix"])
            if token is None:
                raise CommandError(f"no token {options['prefix']!r}")
            token_revoke(token=token, actor=actor)
            self.stdout.write(f"revoked {token.prefix}… ({token.user.username})")
