"""The shared cache's keys carry the console's database name: one Redis may serve two consoles (or a test
run's parallel workers, each on its own database) whose host ids overlap, and a key such as a host's pending
recheck must never be read by the other."""
from django.conf import settings


def make_key(key: str, key_prefix: str, version: int) -> str:
    return f"{key_prefix}:{settings.DATABASES['default']['NAME']}:{version}:{key}"
