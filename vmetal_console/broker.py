"""Kombu transports. The embedded broker: kombu's file-system transport, with each message written whole before it
is visible. Kombu's own `_put` creates `<n>_<uuid>.<queue>.msg` and then writes into it, so a worker listing
the folder at that instant moves and reads a half-written file and dies on the JSON (seen with eight lab
servers heartbeating). Here the message is written under a name no queue matches, then renamed into
place: a rename within one folder is atomic. Redis: kombu's own, with a worker that survives a Redis restart."""
import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, redis
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps
from redis.exceptions import ConnectionError as RedisConnectionError


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".writing-{name}")  # `.writing-…` matches no queue
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel


class RedisChannel(redis.Channel):
    """Redis's channel, surviving a Redis restart. When the broker goes away, Celery closes the lost connection,
    which forgets its address; what touches the channel after that (the close requeueing the worker's
    unacknowledged tasks, a task finishing during the outage and acknowledging its message) then built a
    connection to no address and raised AttributeError, which Celery took for an unrecoverable error: the worker
    exited instead of reconnecting. Here it is the connection error it is, which Celery recovers from; those
    messages stay in Redis's unacked set, which hands them out again after the visibility timeout (and a Redis
    restart without persistence lost them anyway: the periodic re-drive and reconcile take their hosts and pools
    on)."""

    def _connparams(self, asynchronous=False):
        if self.connection.client is None:
            raise RedisConnectionError("the broker connection is closed")
        return super()._connparams(asynchronous=asynchronous)


class RedisTransport(redis.Transport):
    Channel = RedisChannel
