"""What every command uses: its Context, CommandError, and `require` for a mandatory argument. A command is a
function `(args, ctx) -> result dict` that raises CommandError on failure."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from agent.hardware import Hardware


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


def require(args: dict, name: str, command: str):
    value = args.get(name)
    if value in (None, ""):
        raise CommandError(f"{command}: missing argument {name!r}")
    return value
