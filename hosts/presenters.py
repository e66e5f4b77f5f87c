"""What the console shows of hosts: fleet board rows and counts, the host page's parts. The pages and
their live consumers render through these, so a websocket frame is the same HTML as the page."""
from urllib.parse import urlsplit

from django.db.models import Count, F, Func, Subquery
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from core import scoping
from core.views import sort_headers
from events.models import Event
from events.selectors import events_visible
from hosts.selectors import (
    attention_explain,
    erase_certificates_visible,
    health_runs_visible,
    host_inspection_mode,
    host_sku_deviations,
    hosts_needing_attention,
    hosts_visible,
    repair_history,
)
from pools.matching import label_selector_matches
from pools.firmware import below_minimums, wanted_settings
from pools.models import NodeType, external_provider_q
from pools.selectors import node_types_selecting

from .bmc.client import SCHEMES
from .choices import HostState
from .engine.drive import step_status
from .gate.census import disk_text
from .gate.cleaning import effective_cleaning, gpu_count, node_type_for
from .lifecycle import TRANSITIONS, refusal
from .models import BareMetalHost, CommandStatus, HostCommand, RamdiskBoot
from .services import POWER_CYCLE_STATES, host_removal_refusal, power_cycle_refusal
from .topology import host_topology

SECRETS = ("bmc_username", "bmc_password")
ROW_DEFER = (*SECRETS, "inventory", "flow", "root_device_hints")
SHOWN_LABELS = ("rack", "rail-group", "rail_group", "railGroup", "role")


# The fleet board's columns, each with its parts: (label, the name ?sort= knows it by, or "" for no sort).
FLEET_COLUMNS = ((("Host", "name"),), (("State", "state"),), (("Power", "power"),), (("NodeType", ""),),
                 (("Labels", ""),), (("Rack · rail", ""),), (("Claim", "claim"), ("tenant", "tenant")), (("Since", "since"),),
                 (("Error", "error"),))


def sort_columns(query) -> list[dict]:
    """The fleet board's column headers (core.views.sort_headers)."""
    return sort_headers(query, FLEET_COLUMNS)


def node_types_by_selector() -> list[NodeType]:
    """The types a host of the console's own can count for: not an external provider's (its machines are not
    hosts here, whatever its selector says)."""
    return list(NodeType.objects.exclude(external_provider_q("provider__")).select_related("provider")
                .only("name", "host_selector", "provider__kind", "provider__config").order_by("name"))


def node_type_of(host: BareMetalHost, node_types: list[NodeType]) -> str:
    """The NodeType a host counts for: its claim's when it serves one, else the first whose selector matches."""
    claim = getattr(host, "claim", None) if _claim_cached(host) else None
    if claim is not None and claim.node_type_id:
        for t in node_types:
            if t.pk == claim.node_type_id:
                return t.name
    for t in node_types:
        if t.host_selector and label_selector_matches(t.host_selector, host.labels or {}):
            return t.name
    return ""


def _claim_cached(host) -> bool:
    return BareMetalHost.claim.is_cached(host)


def row_queryset(qs=None):
    qs = BareMetalHost.objects.all() if qs is None else qs
    return qs.select_related("claim__tenant").defer(*ROW_DEFER, "claim__requirements", "claim__properties",
                                                     "claim__node_labels", "claim__taints")


def decorate_rows(hosts: list[BareMetalHost], node_types: list[NodeType]) -> list[BareMetalHost]:
    for host in hosts:
        host.node_type_name = node_type_of(host, node_types)
        host.shown_labels = sorted((host.labels or {}).items())
        host.topology = host_topology(host.labels)
    return hosts


def state_counts(qs) -> list[dict]:
    """Hosts per state (every state, 0 included) in one aggregate."""
    counts = dict.fromkeys(HostState.values, 0)
    for row in qs.order_by().values("state").annotate(n=Count("pk")):
        counts[row["state"]] = row["n"]
    return [{"state": s, "label": HostState(s).label, "colour": HostState.colour(s), "count": counts[s]}
            for s in HostState.values]


def render_rows(hosts: list[BareMetalHost], *, may_see_bmc: bool) -> list[str]:
    return [render_to_string("hosts/partials/host_row.html", {"h": h, "may_see_bmc": may_see_bmc, "oob": True})
            for h in hosts]


def render_counts(counts: list[dict], query: str) -> str:
    return render_to_string("hosts/partials/state_counts.html", {"counts": counts, "query": query, "oob": True})


def render_capacity(capacity: dict) -> str:
    return render_to_string("hosts/partials/capacity.html", {"capacity": capacity})


ATTENTION_SHOWN = 10  # on the fleet board; the repair page lists them all


def attention_board(*, acts_on_hosts: bool) -> dict:
    """The fleet board's "needs attention" card: the first ATTENTION_SHOWN hosts and how many there are."""
    # One query: the first hosts picked from the host table alone (a
    # top-N sort of narrow rows), then only those joined to their claims and reasons, and the count of all as
    # an uncorrelated subquery that PostgreSQL runs once. With COUNT(*) OVER () every host needing attention
    # went, joined and wide, through a window and a sort: a median of 39 ms against 13 ms now, at 10,000 hosts of
    # which 4,000 need attention (bench/live.py --board, same rows and count).
    now = timezone.now()
    attention = hosts_needing_attention(BareMetalHost.objects.all(), now=now)
    first = attention.values("pk")[:ATTENTION_SHOWN]
    total = attention.order_by().annotate(n=Func(F("pk"), function="COUNT")).values("n")
    hosts = attention_explain(list(hosts_needing_attention(row_queryset().filter(pk__in=Subquery(first)), now=now)
                                   .annotate(attention_total=Subquery(total))))
    return {"attention": hosts, "attention_total": hosts[0].attention_total if hosts else 0,
            "acts_on_hosts": acts_on_hosts}


def render_attention(*, acts_on_hosts: bool) -> str:
    return render_to_string("hosts/partials/attention.html", attention_board(acts_on_hosts=acts_on_hosts))


# --- the host page ----------------------------------------------------------------------------------

def host_for_page(user, name: str) -> BareMetalHost | None:
    return (hosts_visible(user).select_related("claim__tenant", "claim__node_type").defer(*SECRETS)
            .filter(name=name).first())


def host_events(user, host: BareMetalHost, limit: int = 100) -> list[Event]:
    """The host's timeline. A tenant member sees only the events of their own tenant's use of it."""
    return list(events_visible(user, Event.objects.filter(host_id=host.pk)).order_by("-pk")[:limit])


def current_command(host: BareMetalHost) -> HostCommand | None:
    return (HostCommand.objects.filter(host=host, status__in=[CommandStatus.QUEUED, CommandStatus.SENT])
            .defer("secret_args").order_by("-pk").first())


def host_summary_context(user, host: BareMetalHost) -> dict:
    command = current_command(host)
    flow = host.flow or {}
    acts = scoping.acts_on_hosts(user)
    return {"host": host, "command": command, "flow_name": flow.get("name", ""), "flow_step": flow.get("step", ""),
            "step": step_status(host),
            "steps_done": list((flow.get("done") or {}).keys()), "claim": getattr(host, "claim", None),
            "topology": host_topology(host.labels),
            "may_see_bmc": scoping.may_see_bmc(user), "sees_everything": scoping.sees_everything(user),
            "is_admin": scoping.is_admin(user), "acts_on_hosts": acts,
            "actions": host_actions(host, admin=scoping.is_admin(user)) if acts else []}


def cleaning_shown(host: BareMetalHost) -> str:
    """The cleaning the host gets at its next release and where that comes from (hosts.gate.cleaning's one rule),
    e.g. "full — from NodeType gpu-server (overrides metadata on the host)"."""
    cleaning = effective_cleaning(host, getattr(host, "claim", None))
    source = cleaning["source"]
    if source == "settings.CLEANING_DEFAULT_POLICY":
        source = "the site's default (no NodeType matches)"
    elif source == "host override":
        source = "the host's own cleaning policy"
    text = f"{cleaning['method']} — from {source}"
    if cleaning["fallback"]:
        text += f", else {cleaning['fallback']}"
    if cleaning["overrides"]:
        text += f" (overrides {cleaning['overrides']} on the host)"
    return text


def preflight_shown(host: BareMetalHost) -> dict:
    """The host's last preflight for its page: verdict, when, each check's reason, TLS and the BMC's quirks."""
    detail = host.preflight or {}
    bmc, boot = detail.get("bmc") or {}, detail.get("boot") or {}
    quirks = bmc.get("quirks") or {}
    yes_no = {True: "yes", False: "no"}
    return {
        "checked": host.preflight_ok is not None, "ok": host.preflight_ok, "at": host.preflight_checked_at,
        "reason": host.preflight_reason, "unverified_tls": bool(detail.get("unverified_tls")),
        "checks": [("BMC network", bmc.get("ok"), bmc.get("reason", "")),
                   ("Provisioning network", boot.get("ok"), boot.get("reason", ""))] if detail else [],
        "tls": bmc.get("tls", ""), "via": boot.get("via", ""), "dhcp_checked": boot.get("dhcp_checked"),
        "quirks": [("Virtual media", yes_no.get(quirks.get("virtual_media"), "?")),
                   ("One-time boot override", yes_no.get(quirks.get("boot_once"), "?")),
                   ("Boot override mode", quirks.get("boot_mode") or "not reported")] if quirks else [],
    }


def bmc_tls_shown(host: BareMetalHost) -> str:
    """What protects the BMC connection: plain HTTP has no TLS to verify."""
    scheme = urlsplit(host.bmc_address or "").scheme.lower()
    transport = SCHEMES.get(scheme, ("",))[0]
    if transport == "http":
        return "plain HTTP (no TLS)"
    if transport == "https":
        return "TLS verification off" if host.bmc_disable_certificate_verification else "TLS verification on"
    return f"— ({scheme or 'no'} scheme)"


def bmc_web_url(address: str) -> str:
    """The BMC's own web interface: the address's host and port, over https unless the address says plain http
    (redfish+http://, redfish-virtualmedia+http://). "" for an address without a host."""
    parts = urlsplit(address or "")
    transport = SCHEMES.get(parts.scheme.lower(), ("https",))[0]
    try:
        port = parts.port
    except ValueError:
        return ""
    if not parts.hostname:
        return ""
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{transport}://{host}{f':{port}' if port else ''}/"


def flow_log(host: BareMetalHost) -> dict:
    """What the console keeps of the current flow's run on the agent: its ramdisk boots (how each boot was
    delivered, when the agent called home) and the agent's commands with their output (status, progress,
    message, error). The console keeps no console or boot log text of the server itself."""
    flow_id = (host.flow or {}).get("id", "")
    if not flow_id:
        return {"flow_id": "", "boots": [], "commands": []}
    boots = list(RamdiskBoot.objects.filter(host=host, flow_id=flow_id).defer("secret")
                 .order_by("created_at", "pk")[:20])
    commands = list(HostCommand.objects.filter(host=host, flow_id=flow_id).defer("secret_args", "args", "result")
                    .order_by("pk")[:100])
    return {"flow_id": flow_id, "boots": boots, "commands": commands}


ACTION_LABELS = {"maintenance-on": "Maintenance on", "maintenance-off": "Maintenance off", "retry": "Retry",
                 "power-cycle": "Power cycle", "power-on": "Power on", "power-off": "Power off", "retest": "Retest",
                 "return-to-service": "Return to service", "retire": "Retire", "preflight": "Run preflight",
                 "delete": "Delete", "end-hold": "End the hold"}
# What the fleet board's selection may do (console.fleet_actions), in its menu's order. Release is the claim's.
BULK_ACTIONS = (("maintenance-on", "Maintenance on"), ("maintenance-off", "Maintenance off"), ("retry", "Retry"),
                ("retest", "Retest"), ("power-on", "Power on"), ("power-off", "Power off"),
                ("power-cycle", "Power cycle"), ("release", "Release (its claim)"),
                ("edit", "Edit (credentials, labels)"), ("delete", "Delete"))
DANGEROUS_ACTIONS = frozenset({"power-cycle", "power-off", "retire", "delete", "end-hold"})
# Taking a host out of the fleet for good (retire, delete), changing its BMC credentials (edit) and a tenant's
# claim are the platform admin's; operators do the rest.
ADMIN_ONLY_ACTIONS = frozenset({"retire", "release", "delete", "edit", "end-hold"})


def host_actions(host: BareMetalHost, *, admin: bool = True) -> list[dict]:
    """The actions an admin (or, without the admin's own, an operator) may take on a host in its state (the
    services check again when they run)."""
    allowed = []
    if host.state == HostState.MAINTENANCE:
        allowed.append("maintenance-off")
    elif HostState.MAINTENANCE in _next_states(host.state):
        allowed.append("maintenance-on")
    if host.state == HostState.ERROR:
        allowed.append("retry")
    if host.state == HostState.REPAIR:
        allowed += ["retest", "return-to-service"]
    if HostState.RETIRED in _next_states(host.state):
        allowed.append("retire")
    if host.state in POWER_CYCLE_STATES:
        allowed += ["power-on", "power-off", "power-cycle"]
    if host.state != HostState.RETIRED:
        allowed.append("preflight")
    if host.kept_until is not None and host.state == HostState.AVAILABLE:
        allowed.append("end-hold")
    allowed.append("delete")  # its confirmation says why not, when it may not go (host_removal_refusal)
    return [{"slug": slug, "label": ACTION_LABELS[slug], "danger": slug in DANGEROUS_ACTIONS} for slug in allowed
            if admin or slug not in ADMIN_ONLY_ACTIONS]


# The actions that are a move of the transition table: their refusal is the table's, with what to do
# (lifecycle.refusal). The others apply in one state; their refusal says which.
ACTION_MOVES = {"maintenance-on": HostState.MAINTENANCE, "retire": HostState.RETIRED}
ACTION_APPLIES = {"maintenance-off": "only a host in maintenance is given back",
                  "retry": "only a host in error is retried", "retest": "only a host in repair is retested",
                  "return-to-service": "only a host in repair returns to service",
                  "preflight": "a retired host is not checked"}


def action_refusal(host: BareMetalHost, action: str) -> str:
    """Why `action` does not apply to the host in its state, and what to do instead; "" when it applies (the
    services check again, under their locks, when it runs)."""
    if action == "delete":
        why = host_removal_refusal(host, state=host.state, claim=_claim_name(host))
        return f"{host.name} cannot be deleted: {why}" if why else ""
    if action in {a["slug"] for a in host_actions(host)}:
        return ""
    if action in ACTION_MOVES:
        return refusal(host.state, ACTION_MOVES[action], host.name)
    applies = ACTION_APPLIES.get(action) or power_cycle_refusal(host.state)
    return f"{host.name} is {host.state}, so {ACTION_LABELS.get(action, action).lower()} does not apply: {applies}"


def _claim_name(host: BareMetalHost) -> str:
    """The name of the claim the host serves ("" if none): the pages read hosts with their claims joined."""
    claim = getattr(host, "claim", None)
    return claim.name if claim is not None else ""


def _next_states(state: str):
    return TRANSITIONS.get(state, ())


def sku_shown(host: BareMetalHost) -> dict:
    """The host's last inventory against the SKU of each NodeType that selects it (pools/sku.py), for its page:
    {"deviations": [(NodeType, [sentences])], "conforms": [NodeType names]}."""
    if not host.inventory:
        return {"deviations": [], "conforms": []}
    types = [t for t in node_types_selecting(host.labels) if t.sku]
    deviations = host_sku_deviations(host, types)
    return {"deviations": sorted(deviations.items()), "conforms": [t.name for t in types if t.name not in deviations]}


def inspection_shown(host: BareMetalHost) -> dict:
    """How the host is inspected (host_inspection_mode) and the drives its BMC listed at the last inspection, kept
    beside the agent's (BareMetalHost.bmc_inventory): {"mode", "mode_from", "inventory_from" ("bmc", "agent" or
    ""), "bmc_drives" (a list, or None when it listed none), "bmc_none" (why the BMC lists nothing), "bmc_read_at"}."""
    mode, mode_from = host_inspection_mode(host)
    bmc = host.bmc_inventory if isinstance(host.bmc_inventory, dict) else {}
    drives = bmc.get("disks")
    return {"mode": mode, "mode_from": mode_from,
            "inventory_from": ("bmc" if (host.inventory or {}).get("source") == "bmc" else
                               "agent" if host.inventory else ""),
            "bmc_drives": [{"serial": d.get("serial") or "", "model": d.get("model") or "", "name": d.get("name") or "",
                            "size": disk_text({**d, "serial": ""}) if d.get("size_bytes") else ""}
                           for d in drives if isinstance(d, dict)] if isinstance(drives, list) else None,
            "bmc_none": bmc.get("none") or "", "bmc_read_at": bmc.get("read_at") or "", "bmc_read": bool(bmc)}


def firmware_shown(host: BareMetalHost) -> dict:
    """The host's BIOS settings (wanted by its NodeType / actual / pending) and firmware components (current against
    the NodeType's minimums), as its BMC last reported them (hosts/flows/firmware.py), for its page."""
    record = host.firmware or {}
    node_type = node_type_for(host, getattr(host, "claim", None))
    declared = (node_type.firmware or {}) if node_type is not None else {}
    actual, pending = record.get("settings") or {}, record.get("pending") or {}
    settings = [{"name": name, "wanted": value, "actual": actual.get(name), "pending": pending.get(name),
                 "ok": name in actual and str(actual[name]) == value}
                for name, value in sorted(wanted_settings(declared).items())]
    components = record.get("components") or []
    minimum = {row["component"]: row for row in below_minimums(declared, components)}
    rows = [{"component": c["component"], "name": c.get("name") or c.get("id"), "current": c.get("currentVersion"),
             "initial": c.get("initialVersion"), "flashed": c.get("lastVersionFlashed"), "updated_at": c.get("updatedAt"),
             "minimum": (minimum.get(c["component"]) or {}).get("minimum"),
             "ok": (minimum.get(c["component"]) or {}).get("ok")} for c in components]
    rows += [{"component": kind, "name": "", "current": None, "initial": None, "flashed": None, "updated_at": None,
              "minimum": row["minimum"], "ok": False} for kind, row in minimum.items() if row["current"] is None]
    return {"node_type": node_type.name if declared else "", "settings": settings,
            "settings_read_at": record.get("settings_read_at"), "components": rows,
            "components_read_at": record.get("components_read_at"), "components_error": record.get("components_error"),
            "below": [r["component"] for r in rows if r["ok"] is False],
            "known": bool(settings or rows or record)}


def inventory_view(inventory: dict, *, macs: bool) -> dict:
    """The agent's inventory and Metal3's imported `hardware` status, in one shape for the page. MAC addresses
    only for those who may see the BMC (never tenant members: a MAC is what an agent lookup names)."""
    inv = inventory or {}
    cpu = inv.get("cpu") or {}
    ram_mib = inv.get("ram_mib") or inv.get("ramMebibytes")
    disks = [{"name": d.get("name") or d.get("path"), "type": d.get("type", ""), "model": d.get("model") or "",
              "serial": d.get("serial") or d.get("serialNumber") or "",
              "size_bytes": d.get("size_bytes") or d.get("sizeBytes") or 0}
             for d in (inv.get("disks") or inv.get("storage") or []) if isinstance(d, dict)]
    nics = [{"name": n.get("name", ""), "mac": n.get("mac", "") if macs else "", "speed_gbps": n.get("speed_gbps") or n.get("speedGbps")}
            for n in inv.get("nics") or [] if isinstance(n, dict)]
    gpus = inv.get("gpus")
    gpu_list = [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []
    return {"cpu": cpu if isinstance(cpu, dict) else {}, "ram_gib": round(ram_mib / 1024) if ram_mib else None,
            "disks": disks, "nics": nics, "gpus": gpu_list, "gpu_count": gpu_count(inv),
            "system": inv.get("system") or {}, "warnings": inv.get("warnings") or [], "known": bool(inv)}


def host_records(user, host: BareMetalHost) -> dict:
    """The host page's lists, for its page and its live view: its disks and NICs, its erase certificates and health
    runs (newest first, as scoping gives them to the certificate pages and the API: staff see all, a tenant member
    only the erases of their own tenant's data and the health runs of those releases, never another tenant's), and
    for staff its repair history and the agent's log of its current flow."""
    certificates = list(erase_certificates_visible(user).filter(host=host).defer("document").order_by("-pk")[:20])
    for cert in certificates:
        cert.url = reverse("certificate", args=[cert.pk])
        cert.json_url = reverse("certificate-json", args=[cert.pk])
    staff = scoping.sees_everything(user)
    return {"inventory": inventory_view(host.inventory, macs=scoping.may_see_bmc(user)),
            "may_see_bmc": scoping.may_see_bmc(user),
            "erase_certificates": certificates,
            "health_runs": list(health_runs_visible(user).filter(host=host)
                                .defer("raw_output", "raw_json", "parsed", "gpus").order_by("-pk")[:20]),
            # Its stays in repair: what failed, each remedy the ladder tried and how it ended.
            "repair_history": repair_history(host) if staff else None,
            # The agent's log of the current flow: staff only, as the BMC is.
            "flow_log": flow_log(host) if scoping.may_see_bmc(user) else None}


def render_host_live(user, host: BareMetalHost) -> list[str]:
    ctx = host_summary_context(user, host)
    # The records too: a release's certificates and health runs appear as its gate writes them.
    return [
        render_to_string("hosts/partials/host_summary.html", {**ctx, "oob": True}),
        render_to_string("hosts/partials/host_records.html", host_records(user, host)),
        render_to_string("events/partials/timeline.html",
                         {"events": host_events(user, host), "timeline_id": "host-timeline", "oob": True}),
    ]


def repair_figures_shown(figures: dict) -> dict:
    """hosts.selectors.repair_stats' figures of one group, with the MTTR in words ("1h05m", "42s")."""
    seconds = figures.get("mttr_s")
    if seconds is None:
        mttr = None
    elif seconds < 120:
        mttr = f"{seconds:.0f}s"
    elif seconds < 7200:
        mttr = f"{seconds / 60:.0f}m"
    else:
        mttr = f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    return {**figures, "mttr": mttr}
