"""The agent's commands by name, and `execute(name, args, ctx)`, which runs one and never raises: the outcome
says ok or not, so the runner can always report something. No HTTP here: tests call commands directly."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from agent.commands.base import CommandError, Context
from agent.commands.endpoint import check_endpoint
from agent.commands.erase import erase, erase_metadata, verify_erase
from agent.commands.gpu import gpu_reset, gpu_state, health_check
from agent.commands.image import write_image
from agent.commands.inspection import inspect
from agent.commands.power import reboot_to_disk
from agent.commands.seed import write_seed

log = logging.getLogger("agent.commands")

COMMANDS: dict[str, Callable[[dict, Context], dict]] = {
    "inspect": inspect,
    "write_image": write_image,
    "write_seed": write_seed,
    "erase_metadata": erase_metadata,
    "erase": erase,
    "verify_erase": verify_erase,
    "gpu_reset": gpu_reset,
    "gpu_state": gpu_state,
    "health_check": health_check,
    "reboot_to_disk": reboot_to_disk,
    "check_endpoint": check_endpoint,
}


@dataclass
class Outcome:
    ok: bool
    result: dict
    error: str | None = None


def execute(name: str, args: dict | None, ctx: Context) -> Outcome:
    """Run the command called `name`; any failure becomes Outcome(ok=False, error=...)."""
    command = COMMANDS.get(name)
    if command is None:
        return Outcome(ok=False, result={}, error=f"unknown command: {name}")
    if args is not None and not isinstance(args, dict):
        return Outcome(ok=False, result={}, error=f"{name}: args must be an object")
    try:
        return Outcome(ok=True, result=command(dict(args or {}), ctx))
    except CommandError as exc:
        log.error("%s failed: %s", name, exc)
        return Outcome(ok=False, result=exc.result, error=str(exc))
    except Exception as exc:  # a bug or an OS error: still reported, with the traceback in the log
        log.exception("%s failed unexpectedly", name)
        return Outcome(ok=False, result={}, error=f"{name}: {type(exc).__name__}: {exc}")
