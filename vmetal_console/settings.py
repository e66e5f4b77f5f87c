"""Settings, read from the environment (12-factor). Defaults give the embedded mode:
SQLite and a file-system Celery broker, so a fresh machine needs nothing but Python.

With DATABASE_URL naming a production database (anything but SQLite) the console refuses to start without its
keys, or with DEBUG on: nothing here falls back to a value written in this file."""
import json
import os
import sys
from pathlib import Path

import dj_database_url

from core import keys
from autonodes import task_names as autonodes_tasks
from claims import task_names as claims_tasks
from events import task_names as events_tasks
from hosts import task_names as hosts_tasks
from machines import task_names as machines_tasks

from . import queues

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("VMETAL_VAR_DIR", BASE_DIR / "var"))
# var/ holds what only the console may read (the embedded database with its sessions and boot secrets, the keys,
# the lab's servers' boot configurations): its owner's only, also where an older start made it readable.
VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
if VAR_DIR.stat().st_uid == os.getuid():
    VAR_DIR.chmod(0o700)


def env_bool(name: str, default: bool) -> bool:
    return os.environ.get(name, str(default)).lower() in {"1", "true", "yes", "on"}


_database_url = os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'vmetal.sqlite3'}")  # may hold a password
EMBEDDED = _database_url.startswith("sqlite")  # one machine, SQLite under var/ (./bin/run; the tests' children)
if EMBEDDED:
    os.umask(0o077)  # the SQLite database, its WAL, the broker's messages and logs: readable by their owner only
    _sqlite = Path(_database_url.split("sqlite:///", 1)[-1])
    for _file in (_sqlite, _sqlite.with_name(_sqlite.name + "-wal"), _sqlite.with_name(_sqlite.name + "-shm")):
        if _file.is_file() and _file.stat().st_uid == os.getuid():
            _file.chmod(0o600)
DEBUG = env_bool("DEBUG", False)  # Django's debug pages show code and settings to whoever meets an error

try:
    _keys = keys.load(var_dir=VAR_DIR, embedded=EMBEDDED, debug=DEBUG)
    # The public keys (PEM, one or more) of the keys that signed erase certificates before a rotation: published
    # beside the current one (hosts/gate/certificates.py), so older certificates still verify.
    CERTIFICATE_VERIFY_KEYS = keys.from_environment("CERTIFICATE_VERIFY_KEYS")
    # The names the console answers to (the Host header), and so the websockets' accepted Origins
    # (vmetal_console/asgi.py): the loopback names in the embedded mode, required in production.
    ALLOWED_HOSTS = keys.allowed_hosts(os.environ.get("ALLOWED_HOSTS", ""), embedded=EMBEDDED)
except keys.StartupRefused as _refused:
    sys.exit(f"vMetal Console cannot start:\n  {_refused}")  # a configuration mistake: a message, no traceback
SECRET_KEY = _keys["SECRET_KEY"]
# Fernet keys for secrets at rest (BMC credentials, kubeconfigs), comma separated, newest first: data encrypted
# under an older key still reads, and `manage.py rotate-field-keys` re-encrypts it under the newest.
FIELD_ENCRYPTION_KEYS = [k.strip() for k in _keys["FIELD_ENCRYPTION_KEY"].split(",") if k.strip()]
# The Ed25519 private key (PEM) that signs erase certificates (hosts/gate/certificates.py).
CERTIFICATE_SIGNING_KEY = _keys["CERTIFICATE_SIGNING_KEY"]

INSTALLED_APPS = [
    "daphne",  # an ASGI runserver (websockets); must come before django.contrib.staticfiles
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "core",
    "events",
    "pools",
    "access",  # API tokens (stored hashed) and the service users that hold them
    "hosts",
    "claims",
    "machines",  # machines from other providers: KubeVirt, a Metal3 cluster, OpenTofu
    "autonodes",
    "manifests",
    "console",
    # The lab (a simulated data centre: `manage.py lab`) is installed where it runs: the embedded console, the
    # tests and the benchmarks. The product runs without it (VMETAL_LAB=0, the default with a real database).
    *(["lab"] if env_bool("VMETAL_LAB", EMBEDDED) else []),
    "vmetal_console",  # the key checks and their canary (vmetal_console/checks.py)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "core.csp.ContentSecurityPolicy",  # scripts from the console's static files only (core/csp.py)
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "core.origin.RequestOriginMiddleware",  # the Event log's client address and sign-in (core/origin.py)
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
            ],
            "builtins": ["core.templatetags.console"],  # `when` and `since` on every page without a load
        },
    }
]
WSGI_APPLICATION = "vmetal_console.wsgi.application"
ASGI_APPLICATION = "vmetal_console.asgi.application"

DATABASES = {
    "default": dj_database_url.parse(
        _database_url,
        conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", "0")),
        # A kept connection (DB_CONN_MAX_AGE, or the pool's: Django passes this on as the pool's check) is checked
        # before a request or task reuses it: after PostgreSQL restarts, each process gets new connections
        # instead of errors.
        conn_health_checks=True,
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
        # Also how long a request waits while PostgreSQL is away (the pool cannot connect): then it answers 503
        # with Retry-After (core/outage.py), before a proxy's or an agent's own timeout.
        "timeout": float(os.environ.get("DATABASE_POOL_TIMEOUT_S", "10")),
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

if not DEBUG and not EMBEDDED:  # the embedded console is served over plain HTTP on 127.0.0.1
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
# Queues by kind of work (vmetal_console/queues.py; docs/operations.md, "Queues"): BMC and flow drives, drives an agent's
# call asked for, Auto Nodes, and everything else, each named CELERY_QUEUE_PREFIX + its kind. Consoles (or tests) that
# share one broker keep apart by the prefix: a worker consumes only its own prefix's queues (all of them without -Q).
CELERY_QUEUE_PREFIX = os.environ.get("CELERY_QUEUE_PREFIX", "")
if "CELERY_TASK_DEFAULT_QUEUE" in os.environ:  # the one-queue setting it replaced: refused, not silently ignored
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("CELERY_TASK_DEFAULT_QUEUE is no longer read: tasks go to a queue per kind of work, "
                               "named CELERY_QUEUE_PREFIX + drives, agent, autonodes or celery (docs/operations.md, "
                               "\"Queues\"); set CELERY_QUEUE_PREFIX instead")
CELERY_TASK_QUEUES = queues.declared(CELERY_QUEUE_PREFIX)
CELERY_TASK_DEFAULT_QUEUE = queues.queue_name(CELERY_QUEUE_PREFIX, queues.DEFAULT)
CELERY_TASK_ROUTES = ("vmetal_console.queues.route",)
CELERY_TASK_IGNORE_RESULT = True
# A task is acknowledged after it ran (acks_late), so a worker that dies mid-task leaves it unacknowledged and
# it runs again elsewhere; every task is idempotent, so running twice is safe. A pool child lost mid-task is
# rejected back to the queue at once (reject_on_worker_lost). A whole worker killed cannot say so: RabbitMQ
# requeues its tasks when its connection drops; Redis when they have been unacknowledged for the visibility
# timeout, set below; the file-system broker loses them (the periodic re-drive and reconcile make up for it).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# Redis: longer than any task runs (a drive's steps do not wait; each outside call has its timeout) and any
# countdown waits (a recheck: 30 s at most), or a task still running or waiting would be handed to a second worker. Kombu's default is an
# hour, swept every 100 s; here a killed worker's tasks come back within BROKER_VISIBILITY_TIMEOUT_S plus a
# sweep (every tenth of it, at most 10 s).
BROKER_VISIBILITY_TIMEOUT_S = float(os.environ.get("BROKER_VISIBILITY_TIMEOUT_S", "600"))
if CELERY_BROKER_URL.startswith(("redis://", "rediss://", "sentinel://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": BROKER_VISIBILITY_TIMEOUT_S,
        "unacked_restore_interval": max(1, min(10, int(BROKER_VISIBILITY_TIMEOUT_S / 10))),
        "unacked_restore_throttle": 1,  # every interval scans (kombu's default: every tenth)
    }
if CELERY_BROKER_URL.startswith("redis://"):
    # Redis's transport with a worker that survives a Redis restart (vmetal_console/broker.py).
    CELERY_BROKER_TRANSPORT = "vmetal_console.broker:RedisTransport"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = os.environ.get("CELERY_BEAT_SCHEDULE_FILENAME", str(VAR_DIR / "celerybeat-schedule"))
# Touched at every tick of beat's scheduler (vmetal_console/celery.py); `manage.py probe beat` reads its age.
BEAT_HEARTBEAT_FILE = os.environ.get("BEAT_HEARTBEAT_FILE", str(VAR_DIR / "beat-heartbeat"))
# Beat. With Redis (REDIS_URL), any number of beat processes may run: celery-redbeat keeps the schedule's last runs
# in Redis and lets one beat send, the holder of a lock it renews at every tick (at least every BEAT_LOCK_S / 4);
# the others wait for it, and one of them takes over within BEAT_LOCK_S of the holder's death, resuming the same
# schedule (no period is sent twice); a Redis restart ends no beat (vmetal_console/beat.py). Without Redis (the
# embedded mode) Celery's own scheduler, with its state in a file, for the one beat there is.
BEAT_LOCK_S = max(4, int(float(os.environ.get("BEAT_LOCK_S", "20"))))
if REDIS_URL:
    CELERY_BEAT_SCHEDULER = "vmetal_console.beat:BeatScheduler"  # redbeat's, kept through a Redis restart
    CELERY_BEAT_MAX_LOOP_INTERVAL = BEAT_LOCK_S // 4
    CELERY_REDBEAT_REDIS_URL = REDIS_URL
    CELERY_REDBEAT_REDIS_OPTIONS = {"socket_timeout": 10, "socket_connect_timeout": 5, "health_check_interval": 30}
    CELERY_REDBEAT_LOCK_TIMEOUT = BEAT_LOCK_S
    # Redis' keys span the consoles (and test runs) that share a Redis database: the console's database names them.
    CELERY_REDBEAT_KEY_PREFIX = "vmetal:{}:beat".format(DATABASES["default"]["NAME"])
CELERY_BEAT_SCHEDULE = {
    "reconcile-pools": {"task": claims_tasks.RECONCILE_POOLS, "schedule": float(os.environ.get("RECONCILE_EVERY_S", "30"))},
    "sweep-overdue-hosts": {"task": hosts_tasks.SWEEP_OVERDUE_HOSTS, "schedule": 30.0},
    # External providers (machines/): pending claims get machines, and each machine not gone is looked at.
    "reconcile-machines": {"task": machines_tasks.RECONCILE_MACHINES,
                           "schedule": float(os.environ.get("MACHINES_RECONCILE_EVERY_S", "5"))},
    "drive-stale-hosts": {"task": hosts_tasks.DRIVE_STALE_HOSTS,
                          "schedule": float(os.environ.get("DRIVE_STALE_EVERY_S", "10"))},
    # Available hosts' BMCs, read now and then: a dead one makes its host not allocatable (hosts/capacity.py).
    # The idle health tier (pools/health_tiers.py): the longest-unchecked available hosts, a few at a time.
    "idle-health-checks": {"task": hosts_tasks.IDLE_CHECKS_START,
                           "schedule": float(os.environ.get("IDLE_CHECK_EVERY_S", "60"))},
    "check-bmcs": {"task": hosts_tasks.CHECK_BMCS, "schedule": float(os.environ.get("BMC_CHECK_EVERY_S", "60"))},
    # Preflight (hosts/preflight.py): every host's BMC and boot path, each at most every PREFLIGHT_EVERY_S.
    "preflight-due": {"task": hosts_tasks.PREFLIGHT_DUE, "schedule": float(os.environ.get("PREFLIGHT_DUE_EVERY_S", "60"))},
    # Warm hosts (hosts/flows/warm.py): one idle past its NodeType's idleMinutes, or whose agent is silent, is powered off.
    "sweep-warm-hosts": {"task": hosts_tasks.SWEEP_WARM_HOSTS,
                         "schedule": float(os.environ.get("WARM_SWEEP_EVERY_S", "30"))},
    # The repair ladder's catch-up: hosts in repair whose next rung was asked for and never started (hosts/flows/repair.py).
    "repair-due": {"task": hosts_tasks.REPAIR_DUE, "schedule": float(os.environ.get("REPAIR_DUE_EVERY_S", "60"))},
    # IPAM: addresses whose claim is gone or holds no host are freed, with an Event each (claims/ipam.py).
    # Hosts held for a pool that kept their data disks (claims/kept.py): a hold that ended means the full erase.
    "end-kept-holds": {"task": claims_tasks.END_KEPT_HOLDS, "schedule": float(os.environ.get("KEPT_HOLDS_EVERY_S", "60"))},
    "free-leaked-addresses": {"task": claims_tasks.FREE_LEAKED_ADDRESSES,
                              "schedule": float(os.environ.get("IPAM_LEAK_CHECK_EVERY_S", "300"))},
    # Dynamic pools' claims past their launch deadline: reported once, never relaunched (autonodes/launches.py).
    "check-launches": {"task": autonodes_tasks.CHECK_LAUNCHES,
                       "schedule": float(os.environ.get("AUTONODES_LAUNCH_CHECK_EVERY_S", "30"))},
    # Dynamic pools give back empty, underutilized, expired and drifted nodes (autonodes/disruption.py): one list
    # of each tenant's pods per pass.
    "autonodes-disrupt": {"task": autonodes_tasks.DISRUPT,
                          "schedule": float(os.environ.get("AUTONODES_DISRUPT_EVERY_S", "10"))},
    # Static pools' drifted nodes replaced within their budgets (autonodes/roll.py): the tenant API is read only
    # for a tenant with a drifted node or a roll under way.
    "autonodes-roll": {"task": autonodes_tasks.ROLL, "schedule": float(os.environ.get("AUTONODES_ROLL_EVERY_S", "30"))},
    # Auto Nodes: pods that wait (a limit, the quota, no free host) are decided again now and then.
    "autonodes-decide-waiting": {"task": autonodes_tasks.DECIDE_WAITING,
                                 "schedule": float(os.environ.get("AUTONODES_DECIDE_EVERY_S", "30"))},
    # The audit trail's rows older than AUDIT_RETENTION_DAYS go, once a day (events/audit.py; none while it is 0).
    "prune-audit": {"task": events_tasks.PRUNE_AUDIT, "schedule": 86400.0},
    # Routine step events older than EVENT_RETENTION_DAYS go, once an hour, in batches (events/retention.py): an
    # hour's worth is a few batches, never a year's in one statement.
    "prune-events": {"task": events_tasks.PRUNE_EVENTS, "schedule": 3600.0},
}

# Auto Nodes: a dynamic pool's claim may take its NodeType's measured launch p95 (created → Available, over the
# last AUTONODES_LAUNCH_HISTORY launches of that type) before it is reported as slow, never less than the floor
# and never more than the cap; the cap also applies while a type has no history (claims.selectors.launch_deadlines).
# A slow claim is only reported: a bare-metal server is not deleted and relaunched (Karpenter's registration TTL
# would loop on hardware that takes 20 minutes to arrive).
AUTONODES_LAUNCH_FLOOR_S = float(os.environ.get("AUTONODES_LAUNCH_FLOOR_S", "600"))
AUTONODES_LAUNCH_CAP_S = float(os.environ.get("AUTONODES_LAUNCH_CAP_S", "3600"))
AUTONODES_LAUNCH_HISTORY = int(os.environ.get("AUTONODES_LAUNCH_HISTORY", "50"))

# Host life cycle: each in-progress state's deadline is its flow's step deadlines (below) added up, plus this
# much per step for a drive to notice that a step's deadline passed (a recheck, the periodic re-drive, a lease):
# hosts.lifecycle.deadline_for. Retry caps.
STEP_SLACK_S = float(os.environ.get("STEP_SLACK_S", "60"))
# A claim is Failed once this many distinct hosts failed it (the same host again is bounded by HOST_FAILURE_LIMIT).
CLAIM_MAX_ATTEMPTS = int(os.environ.get("CLAIM_MAX_ATTEMPTS", "3"))
# The most nodes one number may ask for: a static pool's quantity, a dynamic pool's limits.nodes and group size, a
# NodeType's warm hosts (core.limits.check_node_count; 400 past it, in the API, apply, forms and the admin alike).
POOL_MAX_NODES = int(os.environ.get("POOL_MAX_NODES", "10000"))
# The most claims one reconcile pass creates or releases for a pool (and whole groups of it, at least one), each
# pool in its own short transaction; a pool with more to do is reconciled again at once (claims.reconcile).
RECONCILE_BATCH = max(1, int(os.environ.get("RECONCILE_BATCH", "200")))
# A host with this many host-side provisioning failures within the window goes to repair after its cleaning.
HOST_FAILURE_LIMIT = int(os.environ.get("HOST_FAILURE_LIMIT", "3"))
HOST_FAILURE_WINDOW_S = int(os.environ.get("HOST_FAILURE_WINDOW_S", "3600"))
# The repair ladder (hosts/flows/repair.py): a host set aside in repair climbs its NodeType's remedies by itself (off:
# it waits for a person). A power-cycle remedy keeps the host off this long (a cold cycle).
REPAIR_LADDER = env_bool("REPAIR_LADDER", True)
REPAIR_COLD_OFF_S = float(os.environ.get("REPAIR_COLD_OFF_S", "30"))
# An OS image whose write fails on this many distinct hosts (same url and checksum, within the window) is the
# claim's fault: the claim fails with the reason, the hosts are cleaned and return to the pool.
IMAGE_FAILURE_HOSTS = int(os.environ.get("IMAGE_FAILURE_HOSTS", "2"))

# Flow steps (hosts/flows/): how long each may take, in seconds.
def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


BMC_TIMEOUT_S = env_float("BMC_TIMEOUT_S", 10)
BMC_RETRY_S = env_float("BMC_RETRY_S", 5)  # a step whose BMC is away tries again this often, until its deadline
BMC_CHECK_EVERY_S = env_float("BMC_CHECK_EVERY_S", 60)  # the periodic check of available hosts' BMCs
BMC_CHECK_TIMEOUT_S = env_float("BMC_CHECK_TIMEOUT_S", 5)  # its one read, without retries
BMC_CONTACT_REFRESH_S = env_float("BMC_CONTACT_REFRESH_S", 60)  # a flow's successful BMC call is recorded this often
# Preflight (hosts/preflight.py): the BMC and provisioning networks per host, run by the preflight-due beat for
# hosts last checked more than PREFLIGHT_EVERY_S ago, PREFLIGHT_BATCH per pass, PREFLIGHT_CONCURRENCY at a time
# (8: the top of Metal3 BMO's 2-8 concurrent reconciles), each BMC read without retries.
PREFLIGHT_EVERY_S = env_float("PREFLIGHT_EVERY_S", 600)
PREFLIGHT_BATCH = int(os.environ.get("PREFLIGHT_BATCH", "200"))
PREFLIGHT_CONCURRENCY = int(os.environ.get("PREFLIGHT_CONCURRENCY", "8"))
PREFLIGHT_TIMEOUT_S = env_float("PREFLIGHT_TIMEOUT_S", 5)
PREFLIGHT_HTTP_TIMEOUT_S = env_float("PREFLIGHT_HTTP_TIMEOUT_S", 3)
# Whether the ramdisk's kernel and initrd (AGENT_KERNEL_URL, AGENT_INITRD_URL) must answer a HEAD: on, except
# where the lab runs (its simulated servers start the agent from the iPXE script and fetch no kernel).
PREFLIGHT_RAMDISK_CHECK = env_bool("PREFLIGHT_RAMDISK_CHECK", not env_bool("VMETAL_LAB", EMBEDDED))
# A drive's lease on its host, renewed every third of it while the drive runs: a worker killed mid-step holds
# its host this long at most.
DRIVE_LEASE_S = env_float("DRIVE_LEASE_S", 30)
POWER_DEADLINE_S = env_float("POWER_DEADLINE_S", 60)  # a power change lands (the lab: 1-11 s), else asked again
POWER_POLL_S = env_float("POWER_POLL_S", 2)  # how often a step waiting for power looks
POWER_STEP_DEADLINE_S = env_float("POWER_STEP_DEADLINE_S", 180)  # the whole step, BMC retries included
# A firmware update (hosts/flows/firmware.py): its BMC task is looked at this often, and may run this long.
FIRMWARE_POLL_S = env_float("FIRMWARE_POLL_S", 10)
FIRMWARE_UPDATE_DEADLINE_S = env_float("FIRMWARE_UPDATE_DEADLINE_S", 3600)
AGENT_LOOKUP_DEADLINE_S = env_float("AGENT_LOOKUP_DEADLINE_S", 600)  # POST and ramdisk boot on a GPU server
AGENT_COMMAND_DEADLINE_S = env_float("AGENT_COMMAND_DEADLINE_S", 600)
# The boot path's race (hosts/boot/ramdisk.py): a network boot has settled once this window after its power-on has
# passed with one fetch of its iPXE script; before that no certificate is signed, no gate passed, no inspection
# kept and no command with a tenant's secret sent. The window is the NodeType's measured p95 from power-on to
# fetch × 1.5 + BOOT_SETTLE_MARGIN_S (over its last BOOT_SETTLE_HISTORY boots), BOOT_SETTLE_S until
# BOOT_SETTLE_SAMPLES were measured (seconds in the lab and the tests, whose servers' power lands in seconds). A boot
# that nothing fetched within twice its window is lost and booted again early. BOOT_RACES_BEFORE_REPAIR raced
# boots in a row send the host to repair: its provisioning network is not to be trusted.
BOOT_SETTLE_S = env_float("BOOT_SETTLE_S", 3 if env_bool("VMETAL_LAB", EMBEDDED) else 300)
BOOT_SETTLE_MARGIN_S = env_float("BOOT_SETTLE_MARGIN_S", 2 if env_bool("VMETAL_LAB", EMBEDDED) else 30)
BOOT_SETTLE_SAMPLES = int(env_float("BOOT_SETTLE_SAMPLES", 10))
BOOT_SETTLE_HISTORY = int(env_float("BOOT_SETTLE_HISTORY", 200))
BOOT_RACES_BEFORE_REPAIR = int(env_float("BOOT_RACES_BEFORE_REPAIR", 3))
AGENT_SILENCE_S = env_float("AGENT_SILENCE_S", 60)  # no heartbeat for this long: the agent is gone
# Security events (refused agent lookups, boot configurations asked for again): one row per host, boot and reason
# in this window; repeats are counted into it (hosts.boot.ramdisk.security_event).
SECURITY_EVENT_WINDOW_S = env_float("SECURITY_EVENT_WINDOW_S", 600)
# A warm host's idle agent (hosts/flows/warm.py) asks for work in a long poll (hosts/protocol/poll.py): the agent listener
# holds the ask until there is work (a claim reaches the agent at once) or this long, so a warm host costs one
# request per WARM_POLL_S. Its agent counts as silent only after WARM_POLL_S + AGENT_SILENCE_S without an ask.
# Keep it under the idle timeout of any proxy between the servers and the agent listener (the agent accepts 900 s
# at most; a Kubernetes watch is held 30-60 minutes).
WARM_POLL_S = env_float("WARM_POLL_S", 600)
# Without Redis (the embedded mode) nothing wakes a held poll: it looks at the database this often instead.
WARM_POLL_TICK_S = env_float("WARM_POLL_TICK_S", 1)
# The same long poll for the idle agent of a host that a flow drives (provisioning, cleaning, inspecting): its ask
# is held until the flow queues its next command, or this long (a quarter of AGENT_SILENCE_S at most), instead of
# an ask every second between the agent's lookup and its first command, and between two commands. 0: not held.
FLOW_POLL_S = env_float("FLOW_POLL_S", 10)
IMAGE_WRITE_DEADLINE_S = env_float("IMAGE_WRITE_DEADLINE_S", 3600)
NODE_READY_DEADLINE_S = env_float("NODE_READY_DEADLINE_S", 900)
NODE_READY_POLL_S = env_float("NODE_READY_POLL_S", 1)  # how often a joining node is looked at (one GET)
DRAIN_DEADLINE_S = env_float("DRAIN_DEADLINE_S", 300)
DRAIN_GRACE_S = int(env_float("DRAIN_GRACE_S", 30))
DRAIN_POLL_S = env_float("DRAIN_POLL_S", 5)  # a drain looks at the node's pods (and asks refused evictions again)
TENANT_API_TIMEOUT_S = env_float("TENANT_API_TIMEOUT_S", 10)
# The tenant API's VIP checked before an image is written (claims/tenant_check.py): the agent's TCP+TLS timeout,
# how long a failed check holds the tenant's claims when nothing about its API changed, and how long the
# console's own check (tenant page, API) is reused.
TENANT_API_CHECK_TIMEOUT_S = env_float("TENANT_API_CHECK_TIMEOUT_S", 3)
TENANT_API_RETRY_S = env_float("TENANT_API_RETRY_S", 300)
TENANT_API_CONSOLE_CHECK_TTL_S = env_float("TENANT_API_CONSOLE_CHECK_TTL_S", 30)
BOOTSTRAP_TOKEN_TTL_S = int(env_float("BOOTSTRAP_TOKEN_TTL_S", 3600))
# Auto Nodes' pod watchers (autonodes/watcher.py, `manage.py watch-pods`). A tenant's batch of new Pending pods
# closes this long after its last new pod, or this long after it opened, whichever comes first (Karpenter's
# batch window: 1 s idle, 10 s at most); closing it asks for one decision.
AUTONODES_BATCH_IDLE_S = env_float("AUTONODES_BATCH_IDLE_S", 1)
AUTONODES_BATCH_MAX_S = env_float("AUTONODES_BATCH_MAX_S", 10)
AUTONODES_WATCH_POLL_S = env_float("AUTONODES_WATCH_POLL_S", 5)  # the supervisor re-reads which tenants to watch
AUTONODES_WATCH_TIMEOUT_S = env_float("AUTONODES_WATCH_TIMEOUT_S", 300)  # one watch request's life (×1-2, jittered)
AUTONODES_WATCH_BACKOFF_S = env_float("AUTONODES_WATCH_BACKOFF_S", 1)  # after a failure, doubling per failure...
AUTONODES_WATCH_BACKOFF_MAX_S = env_float("AUTONODES_WATCH_BACKOFF_MAX_S", 60)  # ...up to this
# Each tenant's watch is held by one watch-pods process under a lease this long, renewed at every poll (at least
# three times per lease); a dead process's tenants move to the others within it (autonodes/leases.py).
AUTONODES_WATCH_LEASE_S = env_float("AUTONODES_WATCH_LEASE_S", 20)
IMAGE_DIR = Path(os.environ.get("IMAGE_DIR", VAR_DIR / "images"))  # OS images the console serves at /images/
# The agent listener (hosts/protocol/listener.py, `manage.py agent-listener`): the agent protocol, the boot path and the
# OS images, on an address of the provisioning network (a separate port in the embedded mode and the lab). The
# public listener answers 404 for all of it. AGENT_BOOT_URL is that listener as the servers reach it: it goes
# into the iPXE scripts and virtual-media URLs. The ramdisk's kernel and initrd come from AGENT_KERNEL_URL and
# AGENT_INITRD_URL.
AGENT_URLCONF = "vmetal_console.agent_urls"
AGENT_LISTEN = os.environ.get("AGENT_LISTEN", "127.0.0.1:8001")
AGENT_BOOT_URL = os.environ.get("AGENT_BOOT_URL", f"http://{AGENT_LISTEN}")
# The same listener as the console itself reaches it, where the servers' address of it is not routable from here
# (a NAT; the lab's QEMU VMs, which reach this host as 10.0.2.2): preflight checks the boot path there. Empty:
# AGENT_BOOT_URL.
AGENT_BOOT_CHECK_URL = os.environ.get("AGENT_BOOT_CHECK_URL", "")
# The listener's server (waitress: hosts/protocol/listener.py). Threads: requests running at once, each held ask among
# them (a warm host's, up to WARM_POLL_S; an idle agent's in a flow, up to FLOW_POLL_S), so at least the hosts in the
# agent's ramdisk at once (warm, provisioning, cleaning) plus room for booting ones. Connections: open
# at most (a half-sent request holds one, never a thread); past it, new ones wait in the backlog, sized for a fleet
# booting at once. A connection silent this long is closed, unless its request is running.
AGENT_LISTENER_THREADS = int(os.environ.get("AGENT_LISTENER_THREADS", "256"))
AGENT_LISTENER_CONNECTIONS = int(os.environ.get("AGENT_LISTENER_CONNECTIONS", "4096"))
AGENT_LISTENER_BACKLOG = int(os.environ.get("AGENT_LISTENER_BACKLOG", "1024"))
AGENT_LISTENER_IDLE_S = int(os.environ.get("AGENT_LISTENER_IDLE_S", "30"))
AGENT_KERNEL_URL = os.environ.get("AGENT_KERNEL_URL", f"{AGENT_BOOT_URL}/images/agent/vmlinuz")
AGENT_INITRD_URL = os.environ.get("AGENT_INITRD_URL", f"{AGENT_BOOT_URL}/images/agent/initrd")
# Kernel arguments the iPXE script adds to the agent's: the ramdisk's output on the serial console (a VM's
# console.log, a server's SOL), where a boot that goes wrong can be read.
AGENT_KERNEL_ARGS = os.environ.get("AGENT_KERNEL_ARGS", "console=ttyS0,115200n8 quiet")
# The provisioning network's DHCP/boot server (dnsmasq; hosts/boot/dhcp.py, `manage.py dhcp-config`). DHCP_RANGE:
# dnsmasq's dhcp-range value (start,end[,netmask][,lease time]); with DHCP_RELAY on, the relayed subnet instead
# (network,static,netmask: requests arrive from a relay, dnsmasq binds to no interface of that subnet).
# DHCP_INTERFACE: the interface on the provisioning network (local mode; empty: every interface). DHCP_ROUTER and
# DHCP_DNS_SERVERS: options 3 and 6 (empty: not sent). DHCP_TFTP_ROOT: where the iPXE binaries are (Debian's
# `ipxe` package: /usr/lib/ipxe with undionly.kpxe, ipxe.efi, snponly.efi).
DHCP_RANGE = os.environ.get("DHCP_RANGE", "172.22.0.100,172.22.0.200,255.255.255.0,1h")
DHCP_RELAY = os.environ.get("DHCP_RELAY", "").lower() in ("1", "true", "yes", "on")
DHCP_INTERFACE = os.environ.get("DHCP_INTERFACE", "")
DHCP_ROUTER = os.environ.get("DHCP_ROUTER", "")
DHCP_DNS_SERVERS = os.environ.get("DHCP_DNS_SERVERS", "")
DHCP_TFTP_ROOT = os.environ.get("DHCP_TFTP_ROOT", "/usr/lib/ipxe")

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
    # A refused request (4xx) is logged as one line (core.logs): on django.request itself, and on the handler
    # for the django.security.* loggers' refusals.
    "filters": {"refusals_one_line": {"()": "core.logs.RefusalsOneLine"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain",
                             "filters": ["refusals_one_line"]}},
    "loggers": {"django.request": {"filters": ["refusals_one_line"]}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

# The API's and the console's own settings live in their modules. Each may define APPS (added to
# INSTALLED_APPS), MIDDLEWARE_FIRST / MIDDLEWARE_AFTER_AUTH / MIDDLEWARE_LAST, AUTH_BACKENDS, and any
# other setting by its plain name.
from . import settings_api, settings_console, settings_signin  # noqa: E402

# Passwords (superusers only with LOCAL_SIGN_IN=break-glass); settings_signin adds single sign-on's.
AUTHENTICATION_BACKENDS = ["access.sessions.LocalPasswordBackend"]
for _module in (settings_signin, settings_api, settings_console):  # each prepends its backends: axes. ends first
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
# /healthz and /readyz before everything else, on both listeners (vmetal_console/probes.py).
MIDDLEWARE.insert(0, "vmetal_console.probes.ProbeMiddleware")

# The release gate (hosts/gate/cleaning.py): erase, verify, GPU reset, health suite. Erase certificates are signed
# with Ed25519 under CERTIFICATE_SIGNING_KEY (above).
# Backup and restore (hosts/restore.py, hosts/gate/archive.py): a directory outside the database (shared by every
# worker, on storage the database's backups do not restore over) where every erase certificate is also written, once,
# and where the world's epoch lives; empty: no archive, and a restore is known only through `manage.py restore`.
CERTIFICATE_ARCHIVE_DIR = os.environ.get("CERTIFICATE_ARCHIVE_DIR", "")
# How soon the world reconcile after a restore tries again the hosts whose BMC or tenant API did not answer.
RESTORE_RETRY_S = env_float("RESTORE_RETRY_S", 15)
CLEANING_DEFAULT_POLICY = os.environ.get("CLEANING_DEFAULT_POLICY", "full")  # for a host no NodeType matches
# How long a host whose data disks a re-image kept waits for its pool's claim before the full erase (hosts/gate/plan.py).
KEPT_DISKS_HOLD_S = int(os.environ.get("KEPT_DISKS_HOLD_S", "3600"))
ERASE_DEADLINE_S = env_float("ERASE_DEADLINE_S", 3 * 3600)
VERIFY_DEADLINE_S = env_float("VERIFY_DEADLINE_S", 3 * 3600)
HEALTH_DEADLINE_S = env_float("HEALTH_DEADLINE_S", 2 * 3600)
# The intake tier's steps (its burn-in runs for the NodeType's burnIn; its budget fails it sooner).
BURNIN_DEADLINE_S = env_float("BURNIN_DEADLINE_S", 12 * 3600)

# Auto Nodes decisions (autonodes.services): what daemonset pods take on every node of a dynamic pool, counted
# before the tenant's pods (one setting for all pools: the console does not watch the tenants' DaemonSets), as
# JSON: {"cpu": "250m", "memory": "512Mi"}. New pods not decided after this long are swept up by the beat.
AUTONODES_DAEMONSET_OVERHEAD = json.loads(os.environ.get("AUTONODES_DAEMONSET_OVERHEAD",
                                                         '{"cpu": "250m", "memory": "512Mi"}'))
AUTONODES_SWEEP_NEW_AFTER_S = env_float("AUTONODES_SWEEP_NEW_AFTER_S", 30)
# A pod launched on a node that has been Ready this long and still Pending is decided again (the tenant's scheduler
# could not place it there after all).
AUTONODES_BIND_GRACE_S = env_float("AUTONODES_BIND_GRACE_S", 120)

# OpenTofu for terraform providers (machines/tofu, docs/providers-terraform.md): the binary the runner calls, the
# directory of its workspaces and git caches, how long one command may run unless the provider's `timeout` says,
# and the state backend's address as OpenTofu reaches the console (the web listener; ALLOWED_HOSTS must take its
# host). The runner passes OpenTofu only the environment it needs, never the console's own.
TOFU_BINARY = os.environ.get("TOFU_BINARY", "tofu")
TOFU_WORKDIR = Path(os.environ.get("TOFU_WORKDIR", VAR_DIR / "tofu"))
TOFU_TIMEOUT_S = env_float("TOFU_TIMEOUT_S", 3600)
TOFU_STATE_URL = os.environ.get("TOFU_STATE_URL",
                                f"http://127.0.0.1:{os.environ.get('WEB_PORT', '8000')}/api/v1/tofu/state")
