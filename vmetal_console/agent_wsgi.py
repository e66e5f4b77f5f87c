"""WSGI entry point of the agent listener (hosts/protocol/listener.py): `vmetal_console.agent_wsgi:application` in
any WSGI server, or `manage.py agent-listener --bind ADDRESS:PORT`. Bind it to the provisioning network only."""
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vmetal_console.settings")
django.setup(set_prefix=False)

from hosts.protocol.listener import application as listener  # noqa: E402

application = listener()
