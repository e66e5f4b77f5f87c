"""`inspect`: the hardware inventory the console stores on the host (CPU, RAM, disks, NICs, GPUs, system)."""
from __future__ import annotations

from agent.commands.base import Context
from agent.hardware import HardwareError


def inspect(args: dict, ctx: Context) -> dict:
    hw = ctx.hardware
    result = {
        "cpu": hw.cpu(),
        "ram_mib": hw.ram_mib(),
        "disks": [d.to_dict() for d in hw.disks()],
        "nics": [n.to_dict() for n in hw.nics()],
        "gpus": [],
        "system": hw.system(),
    }
    try:
        result["gpus"] = hw.gpus()
    except HardwareError as exc:
        # A GPU server whose driver fails must not look like a CPU server: say why the list is empty.
        result["warnings"] = [str(exc)]
    return result
