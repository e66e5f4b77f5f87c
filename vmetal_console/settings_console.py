"""Settings of the web console and its live updates (Channels)."""
import os

# daphne provides an ASGI `runserver` (websockets in the embedded run mode). Django takes a management
# command from the first app that defines it, so daphne must come before django.contrib.staticfiles:
# settings.py puts it there (APPS here are appended after the built-in ones).
APPS = []

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# Live views (vmetal_console/live.py publishes, the apps' consumers.py render).
# A consumer gathers the changes that arrive within this window into one websocket frame.
CONSOLE_LIVE_FLUSH_S = float(os.environ.get("CONSOLE_LIVE_FLUSH_S", "0.1"))
# A page's summary cards (the fleet board's counts, capacity, needs attention) go at most this often while changes
# stream in, on a clock common to the process, so its pages share one read of each: every tick re-read them, and
# at 200 moves a second that was most of the server's work. A change on a quiet fleet still goes at the next tick.
CONSOLE_LIVE_CARDS_S = float(os.environ.get("CONSOLE_LIVE_CARDS_S", "1.0"))
# How often a consumer re-reads the Event log for changes it may have missed. With an in-memory channel
# layer (embedded mode) this is the only way changes made by the worker process reach the page, so it
# polls often; with Redis it is a safety net for dropped messages.
CONSOLE_LIVE_TAIL_S = float(os.environ.get("CONSOLE_LIVE_TAIL_S", "0.5"))
CONSOLE_LIVE_RESYNC_S = float(os.environ.get("CONSOLE_LIVE_RESYNC_S", "10"))
CONSOLE_PAGE_SIZE = int(os.environ.get("CONSOLE_PAGE_SIZE", "50"))

# With Redis, live updates go over Redis pub/sub: a group message crosses to each web process once and is
# handed to its consumers there, where channels_redis' core layer queues one copy per consumer in Redis and
# delivers them one at a time (20 fleet boards: 20 round trips per host change). Pub/sub keeps nothing for a
# process that is not listening; the consumers' re-sync from the Event log is what makes that safe.
if os.environ.get("REDIS_URL"):
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                                  "CONFIG": {"hosts": [os.environ["REDIS_URL"]]}}}
