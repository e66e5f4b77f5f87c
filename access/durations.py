"""Token lifetimes as people write them: `2s`, `30m`, `12h`, `90d`, `2w`."""
import re

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION_RE = re.compile(r"^\s*(\d{1,7})\s*([smhdw])\s*$")


def parse_duration(text: str) -> int:
    """Seconds; ValueError in words for anything else (a bare number is refused: 90 what?)."""
    match = DURATION_RE.match(str(text))
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a duration: a positive number and a unit, one of s, m, h, d, w "
                         "(2s, 12h, 90d)")
    return int(match.group(1)) * UNITS[match.group(2)]
