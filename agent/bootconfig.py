"""What the boot path gave this boot: `vmetal.console=URL vmetal.boot_secret=S vmetal.host=NAME`, read from the
kernel command line (network boot: the iPXE script's `kernel` line) or from VMETAL.CFG on the virtual-media
CD (same syntax). The secret proves to the console that this agent is the boot it started; it is never logged."""
from __future__ import annotations

from dataclasses import dataclass

PREFIX = "vmetal."


@dataclass
class BootConfig:
    console: str = ""
    boot_secret: str = ""
    host: str = ""

    def __repr__(self) -> str:  # the secret stays out of logs and tracebacks
        return f"BootConfig(console={self.console!r}, host={self.host!r}, boot_secret={'set' if self.boot_secret else 'none'})"


def parse(text: str) -> BootConfig:
    values = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key.startswith(PREFIX):
            values[key[len(PREFIX):]] = value
    return BootConfig(console=values.get("console", ""), boot_secret=values.get("boot_secret", ""),
                      host=values.get("host", ""))


def read(path: str) -> BootConfig:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse(f.read(64 * 1024))
    except OSError:
        return BootConfig()
