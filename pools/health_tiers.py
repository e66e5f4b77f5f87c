"""A NodeType's health tiers: which GPU checks a host of the type passes, when, against which thresholds and
within which time budget (NodeType.health, `spec.health` in its manifest)."""
#     health:
#       handover: {dcgmLevel: 1, gpus: true, links: true, budget: 5m}        every provision, before the node
#                                                                            is handed over
#       release:  {dcgmLevel: 2, ncclMinBusbwGBps: 400, budget: 15m}         between tenants, after the erase
#       intake:   {dcgmLevel: 3, burnIn: 2h, budget: 4h}                    a host's first inspection,
#                                                                            and every retest after repair
#       idle:     {dcgmLevel: 1, gpus: true, links: true, interval: 24h, hostsAtOnce: 2, budget: 10m}
#                                                                            available hosts, now and then
#
# `release` always runs: its defaults are the NodeType's older fields (health_dcgm_level,
# health_nccl_min_busbw_gbps, a manifest's `healthCheck`), which a `health.release` value overrides. The other
# tiers run only when declared (`handover: {}` runs it with the defaults above). `gpus`: GPU count and model
# against the SKU (pools/sku.py); `links`: every NVLink active. `burnIn`: the intake's `dcgmi diag -r LEVEL`
# repeated for that long (once for 0s). `budget`: the tier's checks together; a tier past its budget fails.
from __future__ import annotations

import math

from django.core.exceptions import ValidationError

from core.labels import field_error

from .validators import parse_duration

TIERS = ("handover", "release", "intake", "idle")
FIELDS = {
    "handover": {"dcgmLevel", "gpus", "links", "budget"},
    "release": {"dcgmLevel", "ncclMinBusbwGBps", "budget"},
    "intake": {"dcgmLevel", "burnIn", "budget"},
    "idle": {"dcgmLevel", "gpus", "links", "interval", "hostsAtOnce", "budget"},
}
DEFAULTS = {
    "handover": {"dcgmLevel": 1, "gpus": True, "links": True, "budget": "5m"},
    "release": {"budget": "15m"},
    "intake": {"dcgmLevel": 3, "burnIn": "1h", "budget": "4h"},
    "idle": {"dcgmLevel": 1, "gpus": True, "links": True, "interval": "24h", "hostsAtOnce": 2, "budget": "10m"},
}
LEVELS = {"handover": (0, 4), "release": (0, 4), "intake": (3, 4), "idle": (0, 4)}


def check_health(health) -> None:
    """Every problem of a `health` block, each at its place (`intake.dcgmLevel: ...`)."""
    if health in (None, {}):
        return
    if not isinstance(health, dict):
        raise ValidationError("must be a mapping of tiers: handover, release, intake, idle")
    errors = [field_error((key,), f"unknown tier; expected {', '.join(TIERS)}")
              for key in sorted(set(map(str, health)) - set(TIERS))]
    for tier in TIERS:
        if tier not in health:
            continue
        value = health[tier]
        if value is None:
            value = {}
        if not isinstance(value, dict):
            errors.append(field_error((tier,), f"must be a mapping of {', '.join(sorted(FIELDS[tier]))} ({{}}: "
                                               "the defaults)"))
            continue
        errors += [field_error((tier, k), f"unknown field; expected {', '.join(sorted(FIELDS[tier]))}")
                   for k in sorted(set(map(str, value)) - FIELDS[tier])]
        low, high = LEVELS[tier]
        if "dcgmLevel" in value and not (_integer(value["dcgmLevel"]) and low <= value["dcgmLevel"] <= high):
            what = "3 or 4 (a burn-in runs the long diagnostics)" if tier == "intake" else "0 (not run) to 4"
            errors.append(field_error((tier, "dcgmLevel"), f"dcgmi diag levels here are {what}"))
        busbw = value.get("ncclMinBusbwGBps")
        if "ncclMinBusbwGBps" in value and busbw is not None and not (_number(busbw) and 0 < busbw < math.inf):
            errors.append(field_error((tier, "ncclMinBusbwGBps"), "a bus bandwidth in GB/s above 0, e.g. 400"))
        for key in ("gpus", "links"):
            if key in value and not isinstance(value[key], bool):
                errors.append(field_error((tier, key), f"must be true or false, not {value[key]!r}"))
        for key in ("budget", "burnIn", "interval"):
            if key in value:
                problem = _duration_problem(value[key], zero_ok=key == "burnIn")
                if problem:
                    errors.append(field_error((tier, key), problem))
        if "hostsAtOnce" in value and not (_integer(value["hostsAtOnce"]) and value["hostsAtOnce"] >= 1):
            errors.append(field_error((tier, "hostsAtOnce"), "must be a whole number, 1 or more"))
    if errors:
        raise ValidationError(errors)


def node_type_tiers(node_type) -> dict[str, dict]:
    """The tiers a NodeType runs, with every default filled in and durations in seconds: {tier: {...}}.
    `release` is always there (from the older fields unless `health.release` says otherwise)."""
    declared = node_type.health if node_type is not None and isinstance(node_type.health, dict) else {}
    legacy = {"dcgmLevel": node_type.health_dcgm_level if node_type is not None else 2,
              "ncclMinBusbwGBps": node_type.health_nccl_min_busbw_gbps if node_type is not None else None}
    tiers = {}
    for tier in TIERS:
        if tier != "release" and tier not in declared:
            continue
        values = {**DEFAULTS[tier], **(legacy if tier == "release" else {}), **(declared.get(tier) or {})}
        for key in ("budget", "burnIn", "interval"):
            if key in values:
                values[f"{key}_s"] = _seconds(values[key])
        tiers[tier] = values
    return tiers


def _seconds(text: str) -> float | None:
    duration = parse_duration(text)
    return None if duration is None else duration.total_seconds()


def _duration_problem(value, *, zero_ok: bool) -> str:
    if not isinstance(value, str):
        return f"{value!r} is not a duration such as 90s, 15m or 2h"
    try:
        duration = parse_duration(value)
    except ValueError as exc:
        return str(exc)
    if duration is None:
        return "Never is no duration here: give one such as 15m"
    if duration.total_seconds() <= 0 and not zero_ok:
        return "must be longer than 0s"
    return ""


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
