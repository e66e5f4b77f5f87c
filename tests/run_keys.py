"""Keys for this test run, made before Django's settings are read (pytest.ini loads this with `-p`).

Tests run with PostgreSQL as production does, where SECRET_KEY, FIELD_ENCRYPTION_KEY and CERTIFICATE_SIGNING_KEY
must be set (vmetal_console/keys.py). Those the environment does not give are made here, once per run, into
os.environ: the xdist workers, and the Celery workers, daphne and manage.py processes that tests start, inherit
them, so every process of a run reads and signs with the same keys."""
import os

from core.keys import LOOPBACK_HOSTS, throwaway_keys

os.environ.update(throwaway_keys())
# Tests run as production does, where ALLOWED_HOSTS must be set: the loopback names every test server listens on.
os.environ.setdefault("ALLOWED_HOSTS", ",".join(LOOPBACK_HOSTS))
os.environ.setdefault("VMETAL_LAB", "1")  # the lab app (manage.py lab) is installed for tests and benchmarks
