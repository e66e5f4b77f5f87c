"""The embedded broker: kombu's file-system transport, with each message written whole before it is
visible. Kombu's own `_put` creates `<n>_<uuid>.<queue>.msg` and then writes into it, so a worker listing
the folder at that instant moves and reads a half-written file and dies on the JSON (seen with eight lab
servers heartbeating). Here the message is written under a name no queue matches, then renamed into
place: a rename within one folder is atomic."""
import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


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
