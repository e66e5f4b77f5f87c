"""Beat's scheduler with Redis: celery-redbeat's, kept alive through a Redis restart.

redbeat renews its lock at every tick and lets Redis' ConnectionError through, and Celery's beat exits on it: with
beat gone nothing re-drives what the restart lost. Here a tick while Redis is away sends nothing and the next one
comes a second later. When Redis is back the lock may be gone (a Redis that saves nothing loses every key): this
beat takes it back only if nobody holds it, else it waits as a beat that never held it does. A schedule Redis lost
is installed again (its last runs lost with it: each entry is sent once at once, then at its period)."""
import logging

import redis.exceptions
from redbeat.schedulers import LUA_EXTEND_TO_SCRIPT, RedBeatScheduler, get_redis

log = logging.getLogger("celery.beat")

REDIS_AWAY_RETRY_S = 1.0
REDIS_AWAY = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class BeatScheduler(RedBeatScheduler):
    redis_away = False

    def tick(self, *args, **kwargs):
        try:
            if self.lock_key and not self._lock_held():
                return self.max_interval  # another beat sends; look again as redbeat's waiting beats do
            self._schedule_kept()
            interval = super().tick(*args, **kwargs)
        except REDIS_AWAY as exc:
            if not self.redis_away:
                log.warning("beat: Redis unreachable (%s): sending nothing, trying again every %ss",
                            exc, REDIS_AWAY_RETRY_S)
            self.redis_away = True
            return REDIS_AWAY_RETRY_S
        except redis.exceptions.LockError as exc:  # lost between our renewal and redbeat's: decided next tick
            log.warning("beat: lock lost during the tick (%s)", exc)
            return REDIS_AWAY_RETRY_S
        if self.redis_away:
            log.info("beat: Redis reachable again")
            self.redis_away = False
        return interval

    def _lock_held(self) -> bool:
        """Renew the lock, or take it if nobody holds it (never held: its start-up wait failed with Redis away;
        or lost: expired, or gone with a restarted Redis)."""
        if self.lock is not None:
            try:
                self.lock.extend(int(self.lock_timeout))
                return True
            except redis.exceptions.LockNotOwnedError:
                log.warning("beat: lock lost; taking it back if nobody holds it")
        lock = self._new_lock()
        if lock.acquire(blocking=False):
            log.info("beat: Acquired lock")
            self.lock = lock
            return True
        self.lock = None
        return False

    def _new_lock(self):
        # As redbeat's start-up (redbeat.schedulers.acquire_distributed_beat_lock): its extend sets the lease anew
        # rather than adding to what is left.
        client = get_redis(self.app)
        lock = client.lock(self.lock_key, timeout=self.lock_timeout, sleep=self.max_interval)
        lock.lua_extend = client.register_script(LUA_EXTEND_TO_SCRIPT)
        return lock

    def _schedule_kept(self) -> None:
        if not get_redis(self.app).exists(self.app.redbeat_conf.schedule_key):
            log.warning("beat: the schedule is gone from Redis (restarted without saving?): installing it again")
            self.setup_schedule()

    def close(self):
        try:
            super().close()
        except REDIS_AWAY:  # stopping while Redis is away: the lock lapses by itself
            self.lock = None
