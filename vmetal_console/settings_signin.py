"""Settings of signing in: OIDC single sign-on (mozilla-django-oidc, access/oidc.py), local password sign-in,
the roles an identity provider's groups give, and the session's limits (docs/access.md)."""
import json
import os

from django.core.exceptions import ImproperlyConfigured

# --- OIDC: on when OIDC_ISSUER and OIDC_CLIENT_ID are set -------------------------------------------------------
OIDC_ISSUER = os.environ.get("OIDC_ISSUER", "").rstrip("/")  # the `iss` every ID token must carry, exactly
OIDC_RP_CLIENT_ID = os.environ.get("OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = os.environ.get("OIDC_CLIENT_SECRET", "")
OIDC_ENABLED = bool(OIDC_ISSUER and OIDC_RP_CLIENT_ID)
OIDC_RP_SCOPES = os.environ.get("OIDC_SCOPES", "openid profile email groups")
OIDC_USERNAME_CLAIM = os.environ.get("OIDC_USERNAME_CLAIM", "preferred_username")  # the console's username
OIDC_GROUPS_CLAIM = os.environ.get("OIDC_GROUPS_CLAIM", "groups")  # a list of group names (or paths)
# The provider's endpoints: read from its discovery document ({issuer}/.well-known/openid-configuration) at the
# first sign-in, unless given here.
OIDC_OP_AUTHORIZATION_ENDPOINT = os.environ.get("OIDC_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = os.environ.get("OIDC_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = os.environ.get("OIDC_USERINFO_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = os.environ.get("OIDC_JWKS_ENDPOINT", "")
# The CA that signed the provider's certificate (a PEM bundle); the system's when empty.
OIDC_VERIFY_SSL = os.environ.get("OIDC_CA_BUNDLE") or True
OIDC_TIMEOUT = float(os.environ.get("OIDC_TIMEOUT_S", "10"))
OIDC_RP_SIGN_ALGO = os.environ.get("OIDC_SIGN_ALGO", "RS256")
OIDC_USE_PKCE = True
OIDC_USE_NONCE = True
OIDC_CREATE_USER = True
OIDC_CLOCK_SKEW_S = float(os.environ.get("OIDC_CLOCK_SKEW_S", "30"))  # leeway on exp and iat
OIDC_CALLBACK_CLASS = "access.oidc.CallbackView"
OIDC_AUTHENTICATE_CLASS = "access.oidc.AuthenticateView"
LOGIN_REDIRECT_URL_FAILURE = "/login/?sso=refused"
# The roles an identity provider's groups give, at each sign-in: {group pattern: role}; `{tenant}` stands for a
# tenant's name. Roles: admin, operator, auditor, tenant-admin, tenant-viewer. A JSON object in the environment.
OIDC_GROUP_ROLES_DEFAULT = {
    "platform-admins": "admin",
    "platform-operators": "operator",
    "platform-auditors": "auditor",
    "tenant-{tenant}-admins": "tenant-admin",
    "tenant-{tenant}-viewers": "tenant-viewer",
}
try:
    OIDC_GROUP_ROLES = json.loads(os.environ["OIDC_GROUP_ROLES"]) if os.environ.get("OIDC_GROUP_ROLES") \
        else OIDC_GROUP_ROLES_DEFAULT
except json.JSONDecodeError as error:
    raise ImproperlyConfigured(f"OIDC_GROUP_ROLES: not JSON ({error})") from None

# --- local password sign-in: "on" for everyone, or "break-glass": superusers only (the rest use SSO) ------------
LOCAL_SIGN_IN = os.environ.get("LOCAL_SIGN_IN", "on")
if LOCAL_SIGN_IN not in ("on", "break-glass"):
    raise ImproperlyConfigured(f"LOCAL_SIGN_IN={LOCAL_SIGN_IN!r}: expected on or break-glass")
AUTH_BACKENDS = ["access.oidc.OidcBackend"] if OIDC_ENABLED else []

# --- sessions ---------------------------------------------------------------------------------------------------
# A session unused for this long is over (the next page asks to sign in again); 8 hours.
SESSION_IDLE_TIMEOUT_S = int(os.environ.get("SESSION_IDLE_TIMEOUT_S", "28800"))
# Destructive actions (retiring a host, powering one off, releasing claims in bulk, showing a join command) ask
# for a fresh sign-in when the session's sign-in is older than this; 15 minutes.
FRESH_SIGN_IN_S = int(os.environ.get("FRESH_SIGN_IN_S", "900"))
MIDDLEWARE_AFTER_AUTH = ["access.sessions.SessionLimits"]
