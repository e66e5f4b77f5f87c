"""Which disks a release erases and how: a NodeType's disk rules (`spec.cleaning.disks`) and a pool's kept disks
(`cleaning.keepOnReimage`), their vocabulary and checks, and which rule a disk of a host's census falls under."""
# The release gate (hosts/gate/plan.py) reads these per disk. A rule names a role ("os", the disk the image is
# written to, or a name of the NodeType's choosing for data disks), which disks it selects (by the census's
# fields), the method for a re-image of the same pool, and whether a pool may keep it on such a re-image. A host
# that may go to another tenant gets every disk at the strongest level it supports whatever the rules say.
from __future__ import annotations

import math

from django.core.exceptions import ValidationError

from .validators import parse_quantity, validate_dns_label

OS_ROLE = "os"
DATA_ROLE = "data"  # a disk that no rule selects
# Methods by name, each with the NIST SP 800-88 level it reaches when it runs as named (agent/sanitize.py runs
# them). `secure` is the drive's strongest own command, whatever the drive offers; the others name one command.
METHOD_LEVEL = {
    "metadata": "None",  # express: partition tables and signatures only, not a sanitisation
    "full": "Clear",  # one pass of zeros over every user-addressable block
    "secure": "Purge",
    "nvme-format": "Purge",  # Format NVM, Secure Erase Setting 1 (user data erase)
    "nvme-crypto-format": "Purge",  # Format NVM, Secure Erase Setting 2
    "nvme-sanitize-block": "Purge",
    "nvme-sanitize-crypto": "Purge",
    "nvme-sanitize-overwrite": "Purge",
    "ata-secure-erase": "Purge",  # Clear where the drive has only the normal (not enhanced) erase
    "crypto-erase": "Purge",  # the drive's cryptographic erase, by whichever command it offers
}
METHODS = tuple(METHOD_LEVEL)
LEVELS = ("Clear", "Purge")
KINDS = ("nvme", "ssd", "hdd")
RULE_FIELDS = {"role", "match", "method", "fallback", "keepOnReimage"}
MATCH_FIELDS = {"serial", "model", "path", "kind", "rotational", "minSize", "maxSize"}


def _size(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValidationError(f"{where}: a size such as 960Gi or 3.84T")
    try:
        amount = parse_quantity(value)
    except (ValueError, OverflowError):
        amount = float("nan")
    if not math.isfinite(amount) or amount <= 0:
        raise ValidationError(f"{where}: a size such as 960Gi or 3.84T, not {value!r}")
    return amount


def check_disk_rules(rules) -> None:
    """A NodeType's `cleaning.disks`: a list of rules; each problem names the rule by its index."""
    if not isinstance(rules, list):
        raise ValidationError("must be a list of disk rules such as [{role: os, method: metadata}]")
    seen = set()
    for i, rule in enumerate(rules):
        at = f"disks[{i}]"
        if not isinstance(rule, dict):
            raise ValidationError(f"{at}: must be a mapping with role, match, method, fallback, keepOnReimage")
        unknown = sorted(set(map(str, rule)) - RULE_FIELDS)
        if unknown:
            raise ValidationError(f"{at}.{unknown[0]}: unknown field; expected one of {', '.join(sorted(RULE_FIELDS))}")
        role = rule.get("role")
        if not isinstance(role, str) or not role:
            raise ValidationError(f"{at}.role: required: os (the disk the image is written to) or a name for data "
                                  "disks, e.g. scratch")
        try:
            validate_dns_label(role)
        except ValidationError:
            raise ValidationError(f"{at}.role: {role!r} is not a name of lower-case letters, digits and '-'") from None
        if role == DATA_ROLE:
            raise ValidationError(f"{at}.role: 'data' names the disks no rule selects; give this rule its own name")
        if role in seen:
            raise ValidationError(f"{at}.role: {role!r} is named by two rules")
        seen.add(role)
        for key in ("method", "fallback"):
            value = rule.get(key)
            if value is not None and value not in METHODS:
                raise ValidationError(f"{at}.{key}: {value!r} is not one of {', '.join(METHODS)}")
        if rule.get("fallback") and rule.get("fallback") == rule.get("method"):
            raise ValidationError(f"{at}.fallback: a fallback must differ from the method")
        keep = rule.get("keepOnReimage")
        if keep is not None and not isinstance(keep, bool):
            raise ValidationError(f"{at}.keepOnReimage: must be true or false")
        match = rule.get("match")
        if role == OS_ROLE:
            if keep:
                raise ValidationError(f"{at}.keepOnReimage: the OS disk is always erased (a re-image writes it)")
            if match is not None:
                raise ValidationError(f"{at}.match: the OS disk is the one the image is written to (the host's "
                                      "root device hints); it takes no match")
            continue
        if not isinstance(match, dict) or not match:
            raise ValidationError(f"{at}.match: required for a data disk rule: one or more of "
                                  f"{', '.join(sorted(MATCH_FIELDS))}")
        unknown = sorted(set(map(str, match)) - MATCH_FIELDS)
        if unknown:
            raise ValidationError(f"{at}.match.{unknown[0]}: unknown field; expected one of "
                                  f"{', '.join(sorted(MATCH_FIELDS))}")
        for key in ("model", "path"):
            if key in match and not (isinstance(match[key], str) and match[key]):
                raise ValidationError(f"{at}.match.{key}: must be a string")
        serial = match.get("serial")
        if serial is not None and not (isinstance(serial, str) and serial or isinstance(serial, list) and serial
                                       and all(isinstance(s, str) and s for s in serial)):
            raise ValidationError(f"{at}.match.serial: a serial number or a list of them")
        if "kind" in match and match["kind"] not in KINDS:
            raise ValidationError(f"{at}.match.kind: {match['kind']!r} is not one of {', '.join(KINDS)}")
        if "rotational" in match and not isinstance(match["rotational"], bool):
            raise ValidationError(f"{at}.match.rotational: must be true or false")
        low = _size(match["minSize"], f"{at}.match.minSize") if "minSize" in match else None
        high = _size(match["maxSize"], f"{at}.match.maxSize") if "maxSize" in match else None
        if low is not None and high is not None and low > high:
            raise ValidationError(f"{at}.match: minSize is larger than maxSize")


def check_keep_disks(value) -> None:
    """A pool's `cleaning.keepOnReimage`: the data disk roles it keeps on a re-image of the same pool."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError("keepOnReimage: a list of data disk roles of the NodeType, e.g. [scratch]")
    for role in value:
        if role == OS_ROLE:
            raise ValidationError("keepOnReimage: the OS disk is always erased (a re-image writes it)")
        try:
            validate_dns_label(role)
        except ValidationError:
            raise ValidationError(f"keepOnReimage: {role!r} is not a disk role name") from None
    if len(set(value)) != len(value):
        raise ValidationError("keepOnReimage: a role is named twice")


def rule_matches(rule: dict, disk: dict) -> bool:
    """Whether a data disk rule selects a disk of the census ({name, serial, model, size_bytes, type})."""
    match = rule.get("match") or {}
    if "serial" in match:
        serials = match["serial"] if isinstance(match["serial"], list) else [match["serial"]]
        if (disk.get("serial") or "") not in serials:
            return False
    if "model" in match and match["model"].strip().lower() not in (disk.get("model") or "").lower():
        return False
    if "path" in match and match["path"].removeprefix("/dev/") != (disk.get("name") or ""):
        return False
    if "kind" in match and match["kind"] != disk.get("type"):
        return False
    if "rotational" in match and match["rotational"] != (disk.get("type") == "hdd"):
        return False
    size = disk.get("size_bytes") or 0
    if "minSize" in match and size < parse_quantity(match["minSize"]):
        return False
    if "maxSize" in match and size > parse_quantity(match["maxSize"]):
        return False
    return True
