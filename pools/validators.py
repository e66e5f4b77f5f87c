"""Every check of a catalogue field, its shape and its meaning, and the parsers they share: the models' clean()
calls them, so forms, the API and `apply` check alike."""
import ipaddress
import re
from math import isfinite
from datetime import timedelta

import durationpy
from django.core.exceptions import ValidationError

from core.limits import check_node_count

from .choices import REPAIR_LADDER_MAX, ConsolidationPolicy, FailureKind, GroupFailurePolicy, RepairRemedy

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$|^Never$")


def validate_object_name(value: str) -> None:
    if not DNS_SUBDOMAIN.match(value or ""):
        raise ValidationError(
            f"{value!r} is not a valid name: lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit")


def validate_dns_label(value: str) -> None:
    if not DNS_LABEL.match(value or ""):
        raise ValidationError(f"{value!r} is not a valid name: lower-case letters, digits and '-', at most 63")


def parse_duration(value: str) -> timedelta | None:
    """A Go duration as Kubernetes and Karpenter write them (`1h30m`, `90.5s`, `500ms`, `0s`) → timedelta;
    `Never` → None (no limit). ValueError for anything else. The one parser: validation and use agree."""
    if value == "Never":
        return None
    if not DURATION.match(value or ""):
        raise ValueError(f"{value!r} is not a duration such as 30s, 5m, 720h or Never")
    return durationpy.from_str(value)


_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
             "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3}


def parse_quantity(value) -> float:
    """A Kubernetes resource quantity ('64', '500m', '2Ti') as a number."""
    text = str(value).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * _SUFFIXES[suffix]
    return float(text)


def validate_duration(value: str) -> None:
    if value:
        try:
            parse_duration(value)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None


# A budget's schedule as Karpenter takes it (robfig/cron's ParseStandard, which its CRD narrows to five fields or
# a macro), read by Celery's own crontab: no other cron library. Always in UTC, as Karpenter evaluates it.
CRON_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
               "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}


def parse_cron(text: str):
    """'0 9 * * mon-fri' or '@daily' → celery.schedules.crontab; ValueError (saying why) for anything else.
    Celery's crontab matches day-of-month AND day-of-week where cron matches either: write one of the two."""
    from celery.schedules import crontab

    expression = CRON_MACROS.get(str(text).strip(), str(text).strip())
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"{text!r} is not a cron schedule: five fields (minute hour day-of-month month "
                         "day-of-week, e.g. '0 9 * * 1-5') or @hourly, @daily, @weekly, @monthly, @yearly")
    minute, hour, day_of_month, month, day_of_week = fields
    try:
        return crontab(minute=minute, hour=hour, day_of_week=day_of_week, day_of_month=day_of_month,
                       month_of_year=month)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise ValueError(f"{text!r} is not a cron schedule: {exc}") from None


def validate_string_map(value, what: str = "labels") -> None:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValidationError(f"{what} must map strings to strings")


def parse_ip_ranges(text: str) -> list[tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]]:
    """'10.0.0.20-10.0.0.30,10.0.0.40-10.0.0.50' → [(first, last), ...]."""
    ranges = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        try:
            a = ipaddress.ip_address(first.strip())
            b = ipaddress.ip_address((last or first).strip())
        except ValueError:
            raise ValidationError(f"{part!r} is not an IP range such as 10.0.0.20-10.0.0.30") from None
        if b < a:
            raise ValidationError(f"{part!r}: the range ends before it starts")
        ranges.append((a, b))
    return ranges



NETWORK_DATA = "metal3.vcluster.com/network-data"


def validate_network_data(text: str) -> None:
    """A `metal3.vcluster.com/network-data` override: written into the node's seed as is (cloud-init's
    network-config), so it must at least be a YAML (or JSON) mapping."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where else ""
        raise ValidationError(f"{NETWORK_DATA}: not YAML or JSON{at}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict) or not data:
        raise ValidationError(f"{NETWORK_DATA} must be a network configuration (a YAML or JSON mapping, such "
                              "as cloud-init's network-config `version: 2` with `ethernets`)")

# --- shapes of JSON fields ------------------------------------------------------------------------
# What Model.clean() checks before it reads a JSON field's contents, so that a value of the wrong shape (a
# number where a list belongs) is a ValidationError naming the field, never a TypeError: from the admin, a
# form, the API or `apply` alike.

SCALAR = (str, int, float)


def _scalar(value) -> bool:
    return isinstance(value, SCALAR) and not isinstance(value, bool)


def _finite_quantity(value) -> bool:
    try:
        return _scalar(value) and isfinite(parse_quantity(value))
    except (ValueError, OverflowError):
        return False


def check_node_type_selector(value) -> None:
    if not isinstance(value, list):
        raise ValidationError("must be a list of {property, operator, value(s)}")
    for i, req in enumerate(value):
        if not isinstance(req, dict):
            raise ValidationError(f"[{i}]: must be a mapping {{property, operator, value(s)}}")
        if "operator" in req and not isinstance(req["operator"], str):
            raise ValidationError(f"[{i}].operator: must be a string")
        if "value" in req and req["value"] is not None and not _scalar(req["value"]):
            raise ValidationError(f"[{i}].value: must be a string or a number")
        values = req.get("values")
        if values is not None and not (isinstance(values, list) and all(_scalar(v) for v in values)):
            raise ValidationError(f"[{i}].values: must be a list of strings")


def check_taints(value) -> None:
    if isinstance(value, list):
        for i, taint in enumerate(value):
            if isinstance(taint, dict) and not all(isinstance(v, str) for v in taint.values()):
                raise ValidationError(f"[{i}]: key, value and effect are strings")


def check_disruption(value) -> None:
    if isinstance(value, dict):
        for key in ("consolidationPolicy", "consolidateAfter", "minNodeLifetime"):
            if key in value and value[key] is not None and not _scalar(value[key]):
                raise ValidationError(f"{key}: must be a string")
        budgets = value.get("budgets")
        if budgets is not None and not (isinstance(budgets, list) and all(isinstance(b, dict) for b in budgets)):
            raise ValidationError("budgets: must be a list of {nodes: ...}")
        for i, budget in enumerate(budgets or []):
            for key in ("nodes", "schedule", "duration"):
                if budget.get(key) is not None and not _scalar(budget[key]):
                    raise ValidationError(f"budgets[{i}].{key}: must be a string")
            reasons = budget.get("reasons")
            if reasons is not None and not (isinstance(reasons, list) and all(isinstance(r, str) for r in reasons)):
                raise ValidationError(f"budgets[{i}].reasons: must be a list such as [Empty, Drifted]")


def check_quantities(value) -> None:
    """Resources and limits: every amount a finite quantity ('64', '2Ti')."""
    if isinstance(value, dict):
        for key, amount in value.items():
            if not _finite_quantity(amount):
                raise ValidationError(f"{key}: {amount!r} is not a quantity")


def check_host_selector(value) -> None:
    if isinstance(value, dict):
        labels = value.get("matchLabels")
        if labels is not None and not (isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())):
            raise ValidationError("matchLabels: must map label keys to strings")
        expressions = value.get("matchExpressions")
        if expressions is not None:
            if not isinstance(expressions, list):
                raise ValidationError("matchExpressions: must be a list of {key, operator, values}")
            for i, expr in enumerate(expressions):
                if not isinstance(expr, dict):
                    raise ValidationError(f"matchExpressions[{i}]: must be a mapping")
                if not all(isinstance(expr.get(k, ""), str) for k in ("key", "operator")):
                    raise ValidationError(f"matchExpressions[{i}]: key and operator are strings")
                values = expr.get("values")
                if values is not None and not (isinstance(values, list) and all(_scalar(v) for v in values)):
                    raise ValidationError(f"matchExpressions[{i}].values: must be a list of strings")


def collect(errors: dict, name: str, *checks) -> None:
    """Run checks of one field in order, stopping at the first that fails; its messages go under `name`."""
    for check in checks:
        try:
            check()
        except ValidationError as exc:
            # The errors themselves, not their text: one may carry its position inside the field (core.labels).
            items = [e for es in exc.error_dict.values() for e in es] if hasattr(exc, "error_dict") else exc.error_list
            errors.setdefault(name, []).extend(items)
            return


# A tenant's fabric partition (pools.fabric) comes from a range in its NodeEnvironment's (or NodeProvider's)
# properties: `vmetal.dev/fabric-vlan-range: 100-199`, `vmetal.dev/fabric-pkey-range: 0x8001-0x80ff`.
FABRIC_VLAN_RANGE = "vmetal.dev/fabric-vlan-range"
FABRIC_PKEY_RANGE = "vmetal.dev/fabric-pkey-range"
FABRIC_RANGE_PROPERTIES = {"vlan": FABRIC_VLAN_RANGE, "ib-pkey": FABRIC_PKEY_RANGE}
# 802.1Q ids 1-4094 (0 and 4095 are reserved); InfiniBand P_Keys are 15 bits plus the full-membership bit, and
# 0x7fff (the default partition) and its limited twin 0xffff are never a tenant's.
_FABRIC_BOUNDS = {"vlan": (1, 4094), "ib-pkey": (0x0001, 0xfffe)}


def fabric_value_text(kind: str, value: int) -> str:
    """A value as switches write it: VLAN 100, P_Key 0x8001."""
    return f"0x{value:04x}" if kind == "ib-pkey" else str(value)


def parse_fabric_value(kind: str, text: str) -> int:
    text = str(text).strip()
    try:
        value = int(text, 0) if kind == "ib-pkey" else int(text, 10)
    except ValueError:
        example = "0x8001" if kind == "ib-pkey" else "100"
        raise ValidationError(f"{text!r} is not a {'P_Key' if kind == 'ib-pkey' else 'VLAN id'} such as {example}") \
            from None
    low, high = _FABRIC_BOUNDS[kind]
    if not low <= value <= high or (kind == "ib-pkey" and value & 0x7fff in (0, 0x7fff)):
        allowed = "P_Keys 0x0001-0x7ffe (0x8001-0xfffe: full members)" if kind == "ib-pkey" else "VLAN ids 1-4094"
        raise ValidationError(f"{text} is outside the {allowed}")
    return value


def parse_fabric_range(kind: str, text: str) -> tuple[int, int]:
    """`100-199` (VLAN) or `0x8001-0x80ff` (P_Key): the first and last value, both included."""
    first, sep, last = str(text).partition("-")
    if not sep:
        raise ValidationError(f"{FABRIC_RANGE_PROPERTIES[kind]}: {text!r} is not a range such as "
                              f"{'0x8001-0x80ff' if kind == 'ib-pkey' else '100-199'}")
    try:
        low, high = parse_fabric_value(kind, first), parse_fabric_value(kind, last)
    except ValidationError as exc:
        raise ValidationError(f"{FABRIC_RANGE_PROPERTIES[kind]}: {exc.messages[0]}") from None
    if low > high:
        raise ValidationError(f"{FABRIC_RANGE_PROPERTIES[kind]}: {text!r} ends before it starts")
    if kind == "ib-pkey" and (low & 0x8000) != (high & 0x8000):
        raise ValidationError(f"{FABRIC_RANGE_PROPERTIES[kind]}: {text!r} mixes full and limited membership keys")
    return low, high


def check_fabric_ranges(properties: dict) -> None:
    """The fabric ranges a NodeEnvironment's or NodeProvider's properties configure, if any, are well formed."""
    if not isinstance(properties, dict):
        return
    for kind, key in FABRIC_RANGE_PROPERTIES.items():
        if key in properties:
            parse_fabric_range(kind, properties[key])


def check_repair(value) -> None:
    """A NodeType's repair ladder (hosts/flows/repair.py): {"automatic": true|false, "ladders": {KIND: [REMEDY, ...]}}.
    Kinds left out climb the default ladder (pools.choices.DEFAULT_LADDERS); an empty list hands that kind to a
    person at once."""
    if not isinstance(value, dict):
        raise ValidationError("must be a mapping such as {automatic: true, ladders: {gpu-xid: [gpu-reset, retest]}}")
    unknown = sorted(set(map(str, value)) - {"automatic", "ladders"})
    if unknown:
        raise ValidationError(f"{unknown[0]}: unknown field; expected automatic or ladders")
    if "automatic" in value and not isinstance(value["automatic"], bool):
        raise ValidationError("automatic: must be true or false")
    ladders = value.get("ladders", {})
    if not isinstance(ladders, dict):
        raise ValidationError("ladders: must map a failure kind to a list of remedies")
    for kind, remedies in ladders.items():
        if kind not in FailureKind.values:
            raise ValidationError(f"ladders.{kind}: unknown failure kind; expected one of "
                                  f"{', '.join(FailureKind.values)}")
        if not isinstance(remedies, list) or not all(isinstance(r, str) for r in remedies):
            raise ValidationError(f"ladders.{kind}: must be a list of remedies such as [gpu-reset, power-cycle]")
        for i, remedy in enumerate(remedies):
            if remedy not in RepairRemedy.values:
                raise ValidationError(f"ladders.{kind}[{i}]: {remedy!r} is not a remedy; expected one of "
                                      f"{', '.join(RepairRemedy.values)}")
        if len(set(remedies)) != len(remedies):
            raise ValidationError(f"ladders.{kind}: a remedy is listed twice")
        if len(remedies) > REPAIR_LADDER_MAX:
            raise ValidationError(f"ladders.{kind}: at most {REPAIR_LADDER_MAX} remedies")


# --- a NodePool's limits, topology, groups and disruption -----------------------------------------------

def validate_limits(limits) -> None:
    if not isinstance(limits, dict):
        raise ValidationError("limits must be a mapping such as {cpu: '1000', nodes: '4'}")
    for key, value in limits.items():
        try:
            if parse_quantity(value) < 0:
                raise ValueError
        except ValueError:
            raise ValidationError(f"limits.{key}: {value!r} is not a quantity ≥ 0") from None
        if key == "nodes":
            check_node_count(parse_quantity(value), "limits.nodes")


TOPOLOGY_FIELDS = ("sameRack", "sameRailGroup")
GROUP_FIELDS = ("size", "onMemberFailure")
GROUP_MAX_SIZE = 1000


def validate_topology(topology) -> None:
    """{sameRailGroup: true} (every node of the pool on one rail group), {sameRack: true} (in one rack), or both."""
    if not isinstance(topology, dict):
        raise ValidationError("topology must be a mapping such as {sameRailGroup: true}")
    unknown = set(topology) - set(TOPOLOGY_FIELDS)
    if unknown:
        raise ValidationError(f"topology: unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                              f"expected {' or '.join(TOPOLOGY_FIELDS)}")
    for key, value in topology.items():
        if not isinstance(value, bool):
            raise ValidationError(f"topology.{key} must be true or false, not {value!r}")


def validate_group(group) -> None:
    """{size: N, onMemberFailure: Replace | ReleaseGroup}: the pool's nodes come in groups of N hosts of one
    rail group (or of what `topology` names), all placed at once or none."""
    if not isinstance(group, dict):
        raise ValidationError("group must be a mapping such as {size: 4, onMemberFailure: Replace}")
    if not group:
        return
    unknown = set(group) - set(GROUP_FIELDS)
    if unknown:
        raise ValidationError(f"group: unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                              f"expected {', '.join(GROUP_FIELDS)}")
    size = group.get("size")
    if size is None:
        raise ValidationError("group.size is required: how many hosts each group takes at once")
    if not isinstance(size, int) or isinstance(size, bool) or not 2 <= size <= GROUP_MAX_SIZE:
        raise ValidationError(f"group.size must be a whole number from 2 to {GROUP_MAX_SIZE}, not {size!r} "
                              "(a group of 1 is a plain pool)")
    check_node_count(size, "group.size")
    policy = group.get("onMemberFailure", GroupFailurePolicy.REPLACE)
    if policy not in GroupFailurePolicy.values:
        raise ValidationError(f"group.onMemberFailure must be {' or '.join(GroupFailurePolicy.values)}, "
                              f"not {policy!r}")


DISRUPTION_FIELDS = {"consolidationPolicy", "consolidateAfter", "minNodeLifetime", "budgets"}
BUDGET_FIELDS = {"nodes", "schedule", "duration", "reasons"}
# Karpenter's reasons (v1: Empty, Underutilized, Drifted) and Expired: our expiry replaces a node before it goes,
# so a budget may pace it too.
BUDGET_REASONS = ("Empty", "Underutilized", "Drifted", "Expired")


def validate_disruption(disruption) -> None:
    if not isinstance(disruption, dict):
        raise ValidationError("disruption must be a mapping")
    unknown = set(disruption) - DISRUPTION_FIELDS
    if unknown:
        raise ValidationError(f"disruption: unknown field(s) {', '.join(sorted(unknown))}")
    policy = disruption.get("consolidationPolicy")
    if policy is not None and policy not in ConsolidationPolicy.values:
        raise ValidationError(f"disruption.consolidationPolicy must be WhenEmpty or WhenEmptyOrUnderutilized, not {policy!r}")
    if disruption.get("consolidateAfter") is not None:
        validate_duration(str(disruption["consolidateAfter"]))
    # Ours, not Karpenter's: a node is never consolidated younger than this (autonodes.disruption).
    if disruption.get("minNodeLifetime") is not None:
        if str(disruption["minNodeLifetime"]) == "Never":
            raise ValidationError("disruption.minNodeLifetime must be a duration such as 30m (to keep nodes for "
                                  "good, set consolidateAfter: Never)")
        validate_duration(str(disruption["minNodeLifetime"]))
    for i, budget in enumerate(disruption.get("budgets") or []):
        where = f"disruption.budgets[{i}]"
        unknown = set(budget or {}) - BUDGET_FIELDS
        if unknown:
            raise ValidationError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        nodes = str((budget or {}).get("nodes", ""))
        if not (nodes.isdigit() or (nodes.endswith("%") and nodes[:-1].isdigit() and int(nodes[:-1]) <= 100)):
            raise ValidationError(f"{where}.nodes must be a count or a percentage such as '20%'")
        schedule, duration = budget.get("schedule"), budget.get("duration")
        if (schedule is None) != (duration is None):
            raise ValidationError(f"{where}: schedule and duration go together (the budget is in force for "
                                  "duration after each time the schedule fires)")
        if schedule is not None:
            try:
                parse_cron(str(schedule))
            except ValueError as exc:
                raise ValidationError(f"{where}.schedule: {exc}") from None
            if str(duration) == "Never" or not str(duration):
                raise ValidationError(f"{where}.duration must be a duration such as 8h")
            try:
                validate_duration(str(duration))
            except ValidationError as exc:
                raise ValidationError(f"{where}.duration: {exc.messages[0]}") from None
        reasons = budget.get("reasons")
        if reasons is not None:
            wrong = [r for r in reasons if r not in BUDGET_REASONS]
            if wrong or not reasons:
                raise ValidationError(f"{where}.reasons: each one of {', '.join(BUDGET_REASONS)}"
                                      + (f", not {', '.join(map(repr, wrong))}" if wrong else ""))
