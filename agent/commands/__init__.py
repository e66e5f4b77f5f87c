"""The agent's commands: each a function `(args, ctx) -> result dict` that raises CommandError on failure.

`execute(name, args, ctx)` runs one by name and never raises: the outcome says ok or not,
so the runner can always report something. No HTTP here: tests call commands directly.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from agent.hardware import Hardware

log = logging.getLogger("agent.commands")


class CommandError(Exception):
    """A command failed in a way the console should be told about; `result` carries partial facts."""

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message)
        self.result = result or {}


@dataclass
class Context:
    """What a command may use besides its arguments."""

    hardware: Hardware
    progress: Callable[[int | None, str], None] = lambda percent, message: None
    tmp_dir: str | None = None
    allow_reboot: bool = False
    # Facts that outlive one command within this boot (e.g. the image just written, so the
    # seed never overwrites it).
    session: dict = field(default_factory=dict)
    # Set by reboot_to_disk: the runner acts on it only after the result has been reported.
    exit_requested: bool = False
    reboot_requested: bool = False


@dataclass
class Outcome:
    ok: bool
    result: dict
    error: str | None = None


def require(args: dict, name: str, command: str):
    value = args.get(name)
    if value in (None, ""):
        raise CommandError(f"{command}: missing argument {name!r}")
    return value


def _registry() -> dict[str, Callable[[dict, Context], dict]]:
    from agent.commands.endpoint import check_endpoint
    from agent.commands.erase import erase, erase_metadata, verify_erase
    from agent.commands.gpu import gpu_reset, health_check
    from agent.commands.image import write_image
    from agent.commands.inspection import inspect
    from agent.commands.power import reboot_to_disk
    from agent.commands.seed import write_seed

    return {
        "inspect": inspect,
        "write_image": write_image,
        "write_seed": write_seed,
        "erase_metadata": erase_metadata,
        "erase": erase,
        "verify_erase": verify_erase,
        "gpu_reset": gpu_reset,
        "health_check": health_check,
        "reboot_to_disk": reboot_to_disk,
        "check_endpoint": check_endpoint,
    }


def execute(name: str, args: dict | None, ctx: Context) -> Outcome:
    """Run the command called `name`; any failure becomes Outcome(ok=False, error=...)."""
    command = _registry().get(name)
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
