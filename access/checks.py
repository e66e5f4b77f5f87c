"""Startup checks of the sign-in settings: an OIDC_GROUP_ROLES that names no role, or a tenant role without
{tenant}, is an error that names it, rather than groups that silently give nothing."""
from django.conf import settings
from django.core import checks

from .roles import mapping_errors


@checks.register("vmetal_signin")
def group_roles_check(app_configs=None, **kwargs):
    return [checks.Error(message, id="vmetal_signin.E001") for message in mapping_errors(settings.OIDC_GROUP_ROLES)]
