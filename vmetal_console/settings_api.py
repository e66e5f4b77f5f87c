"""Settings of the REST API and web security (kept apart so that they are read in one place)."""
import os
from datetime import timedelta

_debug = os.environ.get("DEBUG", "False").lower() in {"1", "true", "yes", "on"}
_redis_url = os.environ.get("REDIS_URL", "")

APPS = [
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc served from here, not from a CDN
    "axes",
]
# A body over MAX_REQUEST_BODY is refused (413) before anything reads it (vmetal_console/limits.py).
MIDDLEWARE_FIRST = ["core.limits.RequestBodyLimitMiddleware"]
# django-axes wants to be the last middleware and the first authentication backend.
MIDDLEWARE_LAST = ["axes.middleware.AxesMiddleware"]
AUTH_BACKENDS = ["axes.backends.AxesStandaloneBackend"]

REST_FRAMEWORK = {
    # Token first: an anonymous caller gets 401 with `WWW-Authenticate: Token`, not 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "access.authentication.TokenAuthentication",  # `Authorization: Token <key>`
        "rest_framework.authentication.SessionAuthentication",  # the browser; enforces CSRF on writes
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "core.api.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.api.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # JSON only, as the schema documents (DRF's parser, with JSON nested deeper than 100 levels a 400:
    # core/limits.py): a form body cannot say null or leave a field out as JSON does, so it is a 415. The
    # console's pages post to their own views, never to /api/v1/.
    "DEFAULT_PARSER_CLASSES": ["core.limits.JSONParser"],
}

# API tokens (access/): each expires, after API_TOKEN_EXPIRES_DEFAULT unless its maker asks for another lifetime, never
# after API_TOKEN_EXPIRES_MAX (durations: 2s, 30m, 12h, 90d, 2w).
API_TOKEN_EXPIRES_DEFAULT = os.environ.get("API_TOKEN_EXPIRES_DEFAULT", "90d")
API_TOKEN_EXPIRES_MAX = os.environ.get("API_TOKEN_EXPIRES_MAX", "365d")
# The audit trail (the Event log's people's changes and secret reads, docs/audit.md): rows older than this many days
# are pruned by the beat daily (0, the default: kept for ever). Erase certificates and their archive are never pruned.
AUDIT_RETENTION_DAYS = int(os.environ.get("AUDIT_RETENTION_DAYS", "0"))
# The Event log's routine step events (a flow's "started" and "done" of each step) older than this many days are pruned
# by the beat hourly, EVENT_PRUNE_BATCH rows a statement (events/retention.py; 0: kept for ever). Transitions, people's
# changes, security events, failed steps and the gate's evidence stay whatever their age.
EVENT_RETENTION_DAYS = int(os.environ.get("EVENT_RETENTION_DAYS", "90"))
EVENT_PRUNE_BATCH = int(os.environ.get("EVENT_PRUNE_BATCH", "5000"))

# Request bodies: at most this many bytes, API and console alike (the largest is a site's manifests posted to
# /api/v1/apply/). Django's own limit for what it reads into memory (agent calls, form posts) is the same.
MAX_REQUEST_BODY = int(os.environ.get("MAX_REQUEST_BODY_MB", "10")) * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BODY

SPECTACULAR_SETTINGS = {
    "TITLE": "vMetal Console API",
    "DESCRIPTION": "Pools of bare-metal GPU servers for many tenants. Authenticate with `Authorization: Token <key>` "
                   "(POST /api/v1/tokens/ from a logged-in browser session, or `manage.py token create USER`, "
                   "shows a key once).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,  # request bodies without read-only fields, responses without write-only
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "core.api.schema_error_responses",
                             "core.api.schema_plain_query_strings", "core.api.schema_strict_bodies",
                             "core.api.schema_members_see_less"],
}

# One cache for the agent rate limits (and anything else that needs one): per process by default,
# shared by every web process through Redis when REDIS_URL is set.
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _redis_url, "KEY_PREFIX": "vmetal",
         "KEY_FUNCTION": "vmetal_console.cache_keys.make_key"}
        if _redis_url
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "vmetal"}
    )
}

# Agent endpoints (hosts/protocol/api.py): (requests, window in seconds). Lookup is counted per client address
# and many lab agents share 127.0.0.1, so it is generous; heartbeat and result are counted per token
# (one agent heartbeats every second: 60 a minute) and, against forged tokens (each a key of its own), per
# client address too: "call_per_address" is the sum of every agent behind one address, 100 agents by
# default. A lab or bench that runs more agents from one address raises AGENT_CALL_ADDRESS_LIMIT.
AGENT_RATE_LIMITS = {
    "lookup": (int(os.environ.get("AGENT_LOOKUP_LIMIT", "600")), 60),
    "call": (int(os.environ.get("AGENT_CALL_LIMIT", "300")), 60),
    "call_per_address": (int(os.environ.get("AGENT_CALL_ADDRESS_LIMIT", "6000")), 60),
}

# Login throttling (django-axes): 10 failures for one username from one address lock that pair out for an
# hour; a success resets the count. The console's login, the admin login and the browsable API's login all go
# through it (the lockout answer: 429, "Account locked: too many login attempts. Please try again later.").
AXES_ENABLED = os.environ.get("AXES_ENABLED", "True").lower() in {"1", "true", "yes", "on"}
AXES_FAILURE_LIMIT = int(os.environ.get("AXES_FAILURE_LIMIT", "10"))
AXES_COOLOFF_TIME = timedelta(hours=1)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_SENSITIVE_PARAMETERS = ["password", "token", "key"]
AXES_VERBOSE = False  # no "AXES: BEGIN" line on every manage.py command; lockouts are still logged
# The client's address (axes, the agent rate limits): REMOTE_ADDR, or X-Forwarded-For's when REMOTE_ADDR is one
# of TRUSTED_PROXIES (comma-separated addresses or CIDRs: the reverse proxy in front of the console). Unset, the
# header is ignored: otherwise anyone could lock anyone's account out, or dodge their own lockout, by forging it.
TRUSTED_PROXIES = [p.strip() for p in os.environ.get("TRUSTED_PROXIES", "").split(",") if p.strip()]
AXES_CLIENT_IP_CALLABLE = "core.client_address.client_ip"
# Behind a proxy that serves the console at https://console.example.com (comma separated).
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

# Cookies and transport. settings.py already sets secure cookies and HSTS when DEBUG is off; these hold in
# both modes.
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CONTENT_TYPE_NOSNIFF = True
if not _debug:
    # Opt in where nothing but HTTPS should be served; agents on the provisioning network speak plain HTTP.
    SECURE_SSL_REDIRECT = os.environ.get("SECURE_SSL_REDIRECT", "").lower() in {"1", "true", "yes", "on"}
    SECURE_REDIRECT_EXEMPT = [r"^agent/"]
    SECURE_HSTS_PRELOAD = os.environ.get("SECURE_HSTS_PRELOAD", "").lower() in {"1", "true", "yes", "on"}
    # Behind a TLS-terminating proxy that sets X-Forwarded-Proto (opt in: a spoofable header otherwise).
    if os.environ.get("SECURE_PROXY_SSL_HEADER", "").lower() in {"1", "true", "yes", "on"}:
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
