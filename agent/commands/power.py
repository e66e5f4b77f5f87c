"""`reboot_to_disk`: end the ramdisk session so the server boots its installed OS."""
from __future__ import annotations

import os

from agent.commands.base import Context


def reboot_to_disk(args: dict, ctx: Context) -> dict:
    """Flush disks and ask the runner to leave once this result is reported.

    The reboot itself waits for the report (a reboot first would lose the result). It runs
    only with --allow-reboot on hardware that reboots (a simulated server does not); otherwise
    the agent just exits 0 and the console power-cycles the host through its BMC.
    """
    os.sync()
    ctx.exit_requested = True
    ctx.reboot_requested = ctx.allow_reboot and ctx.hardware.reboots
    return {"action": "reboot" if ctx.reboot_requested else "exit"}
