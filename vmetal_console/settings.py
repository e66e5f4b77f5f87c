"""Settings, read from the environment (12-factor). Defaults give the embedded mode:
SQLite and a file-system Celery broker, so a fresh machine needs nothing but Python."""
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("VMETAL_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name: str, default: bool) -> bool:
    return os.environ.get(name, str(default)).lower() in {"1", "true", "yes", "on"}


DEBUG = env_bool("DEBUG", True)
SECRET_KEY = os.environ.get("SECRET_KEY", "dev-insecure-secret-key-change-me" if DEBUG else "")
if not SECRET_KEY:
    raise RuntimeError("SECRET_KEY must be set when DEBUG is off")
# Fernet keys (comma separated, newest first) for secrets at rest; derived from SECRET_KEY when unset.
FIELD_ENCRYPTION_KEYS = [k for k in os.environ.get("FIELD_ENCRYPTION_KEY", "").split(",") if k]
ALLOWED_HOSTS = os.environ.get("ALLOWED_HOSTS", "*").split(",")

INSTALLED_APPS = [
    "daphne",  # an ASGI runserver (websockets); must come before django.contrib.staticfiles
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "events",
    "pools",
    "hosts",
    "claims",
    "manifests",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "vmetal_console.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "vmetal_console.wsgi.application"
ASGI_APPLICATION = "vmetal_console.asgi.application"

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'vmetal.sqlite3'}"),
        conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", "0")),
    )
}
# PostgreSQL connection pool per process (Django's native psycopg pool): DATABASE_POOL_MAX connections at most,
# shared by the process's threads (the web server's requests, a worker's task threads); a request that finds
# all of them busy waits up to DATABASE_POOL_TIMEOUT_S. Without it (0, the default) every request and every
# task opens and closes its own connection, so concurrency is bounded by nothing but PostgreSQL's
# max_connections. Production sets it: the whole console then holds at most the sum over its processes.
DATABASE_POOL_MAX = int(os.environ.get("DATABASE_POOL_MAX", "0"))
if DATABASE_POOL_MAX and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps the connections; Django must not
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": min(int(os.environ.get("DATABASE_POOL_MIN", "1")), DATABASE_POOL_MAX),
        "max_size": DATABASE_POOL_MAX,
        "timeout": float(os.environ.get("DATABASE_POOL_TIMEOUT_S", "30")),
        "max_idle": 60,  # give back what a burst opened
    }
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # WAL lets the web, worker and beat processes read while one writes.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
    # A file, not memory: tests start workers and commands in other processes; one per test run.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"

if not DEBUG:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = 31536000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_CONTENT_TYPE_NOSNIFF = True

REDIS_URL = os.environ.get("REDIS_URL", "")

# Celery. Embedded default: kombu's file-system transport, a broker that needs no server,
# shared by the web, worker and beat processes through files under var/broker/ (messages written
# whole before they are visible: vmetal_console/broker.py).
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://localhost//")
if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT = "vmetal_console.broker:Transport"
    _broker_dir = VAR_DIR / "broker"
    for sub in ("queue", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "celery")
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = os.environ.get("CELERY_BEAT_SCHEDULE_FILENAME", str(VAR_DIR / "celerybeat-schedule"))
CELERY_BEAT_SCHEDULE = {
    "reconcile-pools": {"task": "claims.tasks.reconcile_pools", "schedule": float(os.environ.get("RECONCILE_EVERY_S", "30"))},
    "sweep-overdue-hosts": {"task": "hosts.tasks.sweep_overdue_hosts", "schedule": 30.0},
    "drive-stale-hosts": {"task": "hosts.tasks.drive_stale_hosts",
                          "schedule": float(os.environ.get("DRIVE_STALE_EVERY_S", "10"))},
}

# Host life cycle: how long a host may stay in each in-progress state, and retry caps.
HOST_STATE_DEADLINES = {
    "registering": timedelta(minutes=int(os.environ.get("DEADLINE_REGISTERING_MIN", "10"))),
    "inspecting": timedelta(minutes=int(os.environ.get("DEADLINE_INSPECTING_MIN", "30"))),
    "provisioning": timedelta(minutes=int(os.environ.get("DEADLINE_PROVISIONING_MIN", "60"))),
    "deprovisioning": timedelta(minutes=int(os.environ.get("DEADLINE_DEPROVISIONING_MIN", "240"))),
}
# A claim is Failed once this many distinct hosts failed it (the same host again is bounded by HOST_FAILURE_LIMIT).
CLAIM_MAX_ATTEMPTS = int(os.environ.get("CLAIM_MAX_ATTEMPTS", "3"))
# A host with this many host-side provisioning failures within the window goes to repair after its cleaning.
HOST_FAILURE_LIMIT = int(os.environ.get("HOST_FAILURE_LIMIT", "3"))
HOST_FAILURE_WINDOW_S = int(os.environ.get("HOST_FAILURE_WINDOW_S", "3600"))
# An OS image whose write fails on this many distinct hosts (same url and checksum, within the window) is the
# claim's fault: the claim fails with the reason, the hosts are cleaned and return to the pool.
IMAGE_FAILURE_HOSTS = int(os.environ.get("IMAGE_FAILURE_HOSTS", "2"))

# Flow steps (hosts/flows.py): how long each may take, in seconds.
def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


BMC_TIMEOUT_S = env_float("BMC_TIMEOUT_S", 10)
BMC_RETRY_S = env_float("BMC_RETRY_S", 5)  # a step whose BMC is away tries again this often, until its deadline
POWER_DEADLINE_S = env_float("POWER_DEADLINE_S", 60)  # a power change lands (the lab: 1-11 s), else asked again
POWER_POLL_S = env_float("POWER_POLL_S", 2)  # how often a step waiting for power looks
POWER_STEP_DEADLINE_S = env_float("POWER_STEP_DEADLINE_S", 180)  # the whole step, BMC retries included
AGENT_LOOKUP_DEADLINE_S = env_float("AGENT_LOOKUP_DEADLINE_S", 600)  # POST and ramdisk boot on a GPU server
AGENT_COMMAND_DEADLINE_S = env_float("AGENT_COMMAND_DEADLINE_S", 600)
AGENT_SILENCE_S = env_float("AGENT_SILENCE_S", 60)  # no heartbeat for this long: the agent is gone
IMAGE_WRITE_DEADLINE_S = env_float("IMAGE_WRITE_DEADLINE_S", 3600)
NODE_READY_DEADLINE_S = env_float("NODE_READY_DEADLINE_S", 900)
NODE_READY_POLL_S = env_float("NODE_READY_POLL_S", 1)  # how often a joining node is looked at (one GET)
DRAIN_DEADLINE_S = env_float("DRAIN_DEADLINE_S", 300)
DRAIN_GRACE_S = int(env_float("DRAIN_GRACE_S", 30))
TENANT_API_TIMEOUT_S = env_float("TENANT_API_TIMEOUT_S", 10)
BOOTSTRAP_TOKEN_TTL_S = int(env_float("BOOTSTRAP_TOKEN_TTL_S", 3600))
IMAGE_DIR = Path(os.environ.get("IMAGE_DIR", VAR_DIR / "images"))  # OS images the console serves at /images/
AGENT_ISO_URL = os.environ.get("AGENT_ISO_URL", "http://127.0.0.1:8000/static/agent.iso")

CHANNEL_LAYERS = {
    "default": (
        {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
        if REDIS_URL
        else {"BACKEND": "channels.layers.InMemoryChannelLayer"}
    )
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

# The API's and the console's own settings live in their modules. Each may define APPS (added to
# INSTALLED_APPS), MIDDLEWARE_FIRST / MIDDLEWARE_AFTER_AUTH / MIDDLEWARE_LAST, AUTH_BACKENDS, and any
# other setting by its plain name.
from . import settings_api, settings_console  # noqa: E402

AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
for _module in (settings_api, settings_console):
    INSTALLED_APPS += getattr(_module, "APPS", [])
    MIDDLEWARE = getattr(_module, "MIDDLEWARE_FIRST", []) + MIDDLEWARE
    _auth = MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1
    MIDDLEWARE[_auth:_auth] = getattr(_module, "MIDDLEWARE_AFTER_AUTH", [])
    MIDDLEWARE += getattr(_module, "MIDDLEWARE_LAST", [])
    AUTHENTICATION_BACKENDS = getattr(_module, "AUTH_BACKENDS", []) + AUTHENTICATION_BACKENDS
    for _name in dir(_module):
        if _name.isupper() and _name not in ("APPS", "MIDDLEWARE_FIRST", "MIDDLEWARE_AFTER_AUTH", "MIDDLEWARE_LAST",
                                              "AUTH_BACKENDS"):
            globals()[_name] = getattr(_module, _name)

# The release gate (hosts/cleaning.py): erase, verify, GPU reset, health suite. Erase certificates are signed
# with HMAC-SHA256 under CERTIFICATE_SIGNING_KEY, or a key derived from SECRET_KEY when it is unset.
CERTIFICATE_SIGNING_KEY = os.environ.get("CERTIFICATE_SIGNING_KEY", "")
CLEANING_DEFAULT_POLICY = os.environ.get("CLEANING_DEFAULT_POLICY", "full")  # for a host no NodeType matches
ERASE_DEADLINE_S = env_float("ERASE_DEADLINE_S", 3 * 3600)
VERIFY_DEADLINE_S = env_float("VERIFY_DEADLINE_S", 3 * 3600)
HEALTH_DEADLINE_S = env_float("HEALTH_DEADLINE_S", 2 * 3600)
HOST_STATE_DEADLINES.setdefault("retesting", timedelta(minutes=int(os.environ.get("DEADLINE_RETESTING_MIN", "480"))))
