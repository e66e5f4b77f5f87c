"""python manage.py token create USER [--name N] [--expires 12h] [--read-only] [--only-tenant T ...]
                                      [--service-user ROLE [--tenant T]]
                     | token list [USER] | token revoke PREFIX"""
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from access.models import ApiToken
from access.selectors import token_by_prefix
from access.services import SERVICE_ROLES, service_user_create, token_create, token_revoke
from events.services import cli_actor
from pools.models import Tenant


class Command(BaseCommand):
    help = ("API tokens for automation: `create USER` makes USER a new named token (its other tokens stay) and "
            "prints its key, this once; `list` lists tokens without their keys; `revoke PREFIX` revokes the token "
            "with that prefix. Making and revoking go in the Event log.")

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="make USER a new token and print its key")
        create.add_argument("user")
        create.add_argument("--name", help="what it is for, new among USER's tokens (token, token-2, ...: the first "
                                             "free one)")
        create.add_argument("--expires", help="its lifetime: 2s, 12h, 90d (API_TOKEN_EXPIRES_DEFAULT, at most "
                                              "API_TOKEN_EXPIRES_MAX)")
        create.add_argument("--read-only", action="store_true", help="GET, HEAD and OPTIONS only")
        create.add_argument("--only-tenant", action="append", default=[], metavar="TENANT",
                            help="limit it to this of a member's tenants (repeat for more)")
        create.add_argument("--service-user", choices=SERVICE_ROLES, metavar="{" + ",".join(SERVICE_ROLES) + "}",
                            help="make USER first when missing, a user with no password in this role (an "
                                 "existing USER must have it)")
        create.add_argument("--tenant", help="the tenant a --service-user member belongs to")
        actions.add_parser("list", help="tokens: prefix, user, name, scope, expiry, last use").add_argument(
            "user", nargs="?")
        actions.add_parser("revoke", help="revoke the token with this prefix").add_argument("prefix")

    def handle(self, *args, action, **options):
        actor = cli_actor()
        if action == "create":
            self._create(actor, options)
        elif action == "list":
            tokens = ApiToken.objects.select_related("user").prefetch_related("tenants").order_by("user__username",
                                                                                                  "name")
            if options["user"]:
                tokens = tokens.filter(user__username=options["user"])
            for t in tokens:
                limit = ",".join(sorted(x.name for x in t.tenants.all())) or "-"
                used = t.last_used_at.isoformat(timespec="seconds") if t.last_used_at else "never"
                state = "expired" if t.expired() else f"expires {t.expires_at.isoformat(timespec='seconds')}"
                self.stdout.write(f"{t.prefix}  {t.user.username}  {t.name}  {t.scope}  tenants {limit}  {state}  "
                                  f"last used {used}")
        else:
            token = token_by_prefix(options["prefix"])
            if token is None:
                raise CommandError(f"no token {options['prefix']!r}")
            token_revoke(token=token, actor=actor)
            self.stdout.write(f"revoked {token.prefix}… ({token.user.username})")

    def _create(self, actor: str, options) -> None:
        try:
            if options["service_user"]:
                user = service_user_create(username=options["user"], role=options["service_user"],
                                           tenant_name=options["tenant"], actor=actor)
            else:
                if options["tenant"]:
                    raise CommandError("--tenant goes with --service-user member (--only-tenant limits a token)")
                user = get_user_model().objects.filter(username=options["user"]).first()
                if user is None:
                    raise CommandError(f"no user {options['user']!r} (--service-user admin|auditor|member makes "
                                       "one for automation)")
            tenants = list(Tenant.objects.filter(name__in=options["only_tenant"]))
            unknown = sorted(set(options["only_tenant"]) - {t.name for t in tenants})
            if unknown:
                raise CommandError(f"no tenant {', '.join(unknown)}")
            _, key = token_create(user=user, actor=actor, name=options["name"], expires=options["expires"],
                                  read_only=options["read_only"], tenants=tenants)
        except ValidationError as error:
            raise CommandError("; ".join(error.messages)) from None
        self.stdout.write(key)
