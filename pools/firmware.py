"""A NodeType's BIOS settings and minimum firmware versions, and how a host's own compare with them."""
# The NodeType's `firmware` (spec.firmware in its manifest), both parts optional:
#     settings:   {ProcVirtualization: Enabled, SriovGlobalEnable: Enabled}   BIOS attributes each host must have
#                                                                             (Metal3's HostFirmwareSettings spec.settings)
#     components: [{component: bios, minVersion: "2.4.0"}, ...]               the lowest firmware version allowed per
#                                                                             component: bios, bmc, nic, gpu (a nic or
#                                                                             gpu minimum holds for each NIC or GPU)
# A host's components are named as Metal3's HostFirmwareComponents names them (bios, bmc), NICs and GPUs with their
# inventory id (nic:NIC.1, gpu:GPU.0). Pure functions: the flows, the host page and the API call the same ones.
from __future__ import annotations

import re

from django.core.exceptions import ValidationError

from core.labels import field_error

COMPONENT_KINDS = ("bios", "bmc", "nic", "gpu")
SETTING_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")
SETTINGS_MAX = 200


def check_firmware(value) -> None:
    """Every problem of a NodeType's firmware block, each at its place (`settings.X: ...`)."""
    if value in (None, {}):
        return
    if not isinstance(value, dict):
        raise ValidationError("must be a mapping of settings and components")
    errors = [field_error((str(k),), "unknown field; expected settings, components")
              for k in sorted(set(map(str, value)) - {"settings", "components"})]
    settings = value.get("settings", {})
    if not isinstance(settings, dict):
        errors.append(field_error(("settings",), "must be a mapping of BIOS attribute names to values"))
    else:
        if len(settings) > SETTINGS_MAX:
            errors.append(field_error(("settings",), f"at most {SETTINGS_MAX} settings"))
        for name, wanted in settings.items():
            if not isinstance(name, str) or not SETTING_NAME.match(name):
                errors.append(field_error(("settings", str(name)), "not a BIOS attribute name (letters, digits, "
                                                                   "_ . : -, up to 128 characters)"))
            elif isinstance(wanted, bool) or not isinstance(wanted, (str, int)) or wanted == "":
                errors.append(field_error(("settings", name), "must be a string or a whole number (quote "
                                                              "Enabled, \"1\")"))
    components = value.get("components", [])
    if not isinstance(components, list):
        errors.append(field_error(("components",), "must be a list of {component, minVersion}"))
        components = []
    seen = set()
    for i, item in enumerate(components):
        if not isinstance(item, dict):
            errors.append(field_error(("components", str(i)), "must be a mapping of component, minVersion"))
            continue
        errors += [field_error(("components", str(i), str(k)), "unknown field; expected component, minVersion")
                   for k in sorted(set(map(str, item)) - {"component", "minVersion"})]
        kind = item.get("component")
        if kind not in COMPONENT_KINDS:
            errors.append(field_error(("components", str(i), "component"),
                                      f"{kind!r} is not a component; expected one of {', '.join(COMPONENT_KINDS)}"))
        elif kind in seen:
            errors.append(field_error(("components", str(i), "component"), f"{kind} is listed twice"))
        seen.add(kind)
        version = item.get("minVersion")
        if not (isinstance(version, str) and version.strip()):
            errors.append(field_error(("components", str(i), "minVersion"),
                                      "must be a non-empty string (quote a version: \"2.4\")"))
    if errors:
        raise ValidationError(errors)


def wanted_settings(firmware: dict | None) -> dict[str, str]:
    """The BIOS attributes a NodeType wants, each value as the BIOS shows it (a string; 1 → "1")."""
    settings = (firmware or {}).get("settings") or {}
    return {str(k): str(v) for k, v in settings.items()}


def settings_differences(wanted: dict[str, str], actual: dict) -> dict[str, dict]:
    """{name: {"wanted", "actual"}} for each wanted attribute the BIOS does not have as wanted (actual None: the BIOS
    has no such attribute). Compared as strings: a BIOS shows 1 and "1" alike."""
    return {name: {"wanted": value, "actual": None if name not in actual else str(actual[name])}
            for name, value in sorted(wanted.items()) if name not in actual or str(actual[name]) != value}


def component_name(item_id: str, name: str) -> str:
    """A firmware inventory item's component, as Metal3 names them: bios, bmc; nic:ID and gpu:ID; other:ID."""
    text = f"{item_id} {name}".lower()
    if "gpu" in text or "vbios" in text:
        return f"gpu:{item_id}"
    if any(word in text for word in ("bmc", "idrac", "ilo", "manager")):
        return "bmc"
    if any(word in text for word in ("bios", "uefi", "system rom")):
        return "bios"
    if any(word in text for word in ("nic", "network", "ethernet")):
        return f"nic:{item_id}"
    return f"other:{item_id}"


def version_key(version: str) -> tuple:
    """A version as a sortable key: numbers by value, the rest by text (2.10 > 2.9; 96.00.AF > 96.00.AE)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part.lower())
                 for part in re.split(r"[.\-_ ]+", str(version).strip()) if part)


def below_minimums(firmware: dict | None, components: list[dict]) -> list[dict]:
    """Each component of a host against the NodeType's minimums: [{component, current, minimum, ok}], one row per
    host component a minimum applies to, and a row with current None for a minimum no component answers."""
    rows = []
    for rule in (firmware or {}).get("components") or []:
        kind, minimum = rule["component"], rule["minVersion"]
        matching = [c for c in components if c.get("component", "").split(":", 1)[0] == kind]
        if not matching:
            rows.append({"component": kind, "current": None, "minimum": minimum, "ok": False})
        for c in matching:
            current = c.get("currentVersion") or ""
            rows.append({"component": c["component"], "current": current, "minimum": minimum,
                         "ok": bool(current) and version_key(current) >= version_key(minimum)})
    return rows
