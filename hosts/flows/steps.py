"""The steps the host's flows are made of, and those the claim's flows reuse: the BMC check, power, the agent's
ramdisk and inspection, the release gate (erase → verify → GPU reset → health suite) and the health tiers."""
import dataclasses
import logging

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from events.choices import EventKind
from events.models import Event
from pools.choices import InspectionMode
from pools.gpu import node_type_gpu
from pools.health_tiers import node_type_tiers
from pools.selectors import node_types_selecting
from pools.sku import sku_deviations

from hosts.bmc.client import BMCError
from hosts.boot import ramdisk as boot_path
from hosts.engine.agent import agent_command, boot_settled
from hosts.engine.drive import boot_again, step_retry
from hosts.engine.flow import Run, Step, StepFailed, Waiting, deadline_setting
from hosts.gate import certificates, cleaning, gpu_state, health
from hosts.gate.census import census_take, inventory_disks, record_from
from hosts.gate.plan import erase_plan
from hosts.gate.plan import kept as kept_disks
from hosts.lifecycle import FLOWS
from hosts.models import AgentSession, BareMetalHost, EraseCertificate, HostCommand, RamdiskBoot
from hosts.selectors import BMC_DRIVES, host_inspection_mode, host_sku_deviations, sku_deviations_text
from hosts.services import host_bmc_contact, host_derive_labels, hosts_kept_clear, hosts_kept_set

from .warm import not_kept_warm, step_keep_warm, warm_wanted

log = logging.getLogger(__name__)


def _bmc_call(fn, run: "Run | None" = None):
    """A BMC call from a step, the BMC client's creation included (`_bmc_call(run.bmc, run)`: an address stored
    before the console refused it fails the step with its reason). Transient failures (the BMC down, slow or
    answering 5xx, after the BMC client's own retries) make the step wait and try again until its deadline,
    the last one kept for the deadline's message; the rest (wrong credentials, no such system, a boot MAC the
    system lacks, an address or TLS the console cannot use) fail it at once with their reason."""
    try:
        result = fn()
    except BMCError as exc:
        if run is not None:
            _bmc_contact(run, ok=False, error=str(exc))
        if run is not None and exc.transient:
            raise step_retry(run, str(exc), recheck_s=settings.BMC_RETRY_S) from None
        raise StepFailed(str(exc)) from None
    if run is not None and fn != run.bmc:  # making the client is no contact with the BMC
        _bmc_contact(run, ok=True)
    return result


def bmc_event_log(run: Run) -> dict | None:
    """The BMC's own event log, for a host's repair evidence: {"entries": [...]} (IPMI's SEL, newest last),
    {"error": why it could not be read}, or None where the console reads no log from this kind of BMC (Redfish).
    One try, no retries: the host is going to repair either way."""
    try:
        with run.bmc() as bmc:
            entries = bmc.event_log()
    except BMCError as exc:
        return {"error": str(exc)}
    return None if entries is None else {"entries": entries}


def _bmc_contact(run: Run, *, ok: bool, error: str = "") -> None:
    host_bmc_contact(host=run.host, ok=ok, error=error)


def step_bmc_check(run: Run) -> dict:
    """Registration: the BMC answers, the credentials work, the system exists and has the boot MAC."""
    if not run.host.bmc_password:
        raise StepFailed("no BMC credentials: apply the host's Secret")
    with _bmc_call(run.bmc, run) as bmc:
        found = _bmc_call(lambda: bmc.check(run.host.boot_mac), run)
    power = found.get("power_state", "unknown")
    BareMetalHost.objects.filter(pk=run.host.pk).update(power_state=power)
    return {"system": found.get("system_id"), "power": power}


def _power(run: Run, want: str, boot: str | None = None) -> dict | None:
    """Bring the host's power to `want` ("off", or "on" booting `boot` once) without holding a worker:
    send the change once, then poll on later drives (power lands seconds to minutes later). On the way
    to "on" the host is first powered off, so it really boots what was asked. Returns None when done."""
    scratch = run.data.setdefault(run.flow["step"], {})
    with _bmc_call(run.bmc, run) as bmc:
        state = _bmc_call(bmc.power_state, run)
        if want == "on" and not scratch.get("was_off"):
            if state != "off":
                sent = _send_once(run, scratch, "off", bmc.power_off)
                raise Waiting("powering off first", recheck_s=_power_recheck_s(run.host.pk, "off", sent))
            power_landed(run.host.pk, "off", scratch)
            scratch["was_off"] = True
            boot_path.agent_sessions_end(host_ids=[run.host.pk])  # the boot that ran is over
            run.save_flow()
        if state == want and (want == "off" or "on" in scratch):
            power_landed(run.host.pk, want, scratch)
            if want == "off":  # off, as the BMC says: that boot's agent session ends (not before: it still runs)
                boot_path.agent_sessions_end(host_ids=[run.host.pk])
            BareMetalHost.objects.filter(pk=run.host.pk).update(power_state=want)
            return None

        def switch():
            if want == "off":
                bmc.power_off()
                return
            ramdisk = None
            if boot != "disk":
                # A new ramdisk boot: its secret reaches the server only through the boot path (hosts/boot/ramdisk.py).
                ramdisk = boot_path.ramdisk_boot_start(
                    host=run.host, flow_id=run.flow["id"],
                    via=boot_path.VIRTUAL_MEDIA if bmc.virtual_media_boot else boot_path.IPXE)
            if bmc.virtual_media_boot and ramdisk is not None:
                bmc.insert_virtual_media(ramdisk.media_url)  # its one-time URL: to the BMC only
                bmc.set_boot_once("cd")
            else:
                if bmc.virtual_media_boot:
                    bmc.eject_virtual_media()
                bmc.set_boot_once(boot)
            bmc.power_on()

        def ramdisk_boot_recorded():
            # An agent calling after this is ours. Saved with the request, before the BMC is told: a fast agent
            # looks up before a later drive sees the power land, and the lookup takes only sessions after this.
            run.data["ramdisk_boot_at"] = timezone.now().isoformat()

        sent = _send_once(run, scratch, want, switch,
                          prepare=ramdisk_boot_recorded if want == "on" and boot != "disk" else None)
    raise Waiting(f"waiting for power {want}", recheck_s=_power_recheck_s(run.host.pk, want, sent))


def _send_once(run: Run, scratch: dict, key: str, fn, *, prepare=None) -> bool:
    """A power request, sent once; again only if it has not landed within POWER_DEADLINE_S. `prepare` writes
    what the flow's record must hold before the request goes (it is saved with the request's own record).
    True when it went now."""
    sent = scratch.get(key)
    if sent and (timezone.now() - parse_datetime(sent)).total_seconds() < settings.POWER_DEADLINE_S:
        return False
    if sent:
        # Counted as a try, without waiting: the request goes again now.
        error = f"power {key} not reached within {int(settings.POWER_DEADLINE_S)}s; asked again"
        step_retry(run, error, recheck_s=None)
    # Recorded before it goes: a drive that dies after the BMC took the change but before the record was written
    # (PostgreSQL restarting, a killed worker) would otherwise send it again on the host's next drive.
    if prepare is not None:
        prepare()
    scratch[key] = timezone.now().isoformat()
    run.save_flow()
    try:
        _bmc_call(fn, run)
    except (Waiting, StepFailed):  # the BMC did not take it (away, refused): the next try sends it
        scratch.pop(key, None)
        run.save_flow()
        raise
    return True


# How long the host's power took to land last time, learned per host and direction (the cache): the first look
# after a request waits that long less one POWER_POLL_S, then looks every POWER_POLL_S as before. A host whose
# power lands in 5 s was looked at 3 times per change (each look a drive: a BMC read, the host's row, a recheck);
# now twice, and a slow server (a minute's POST) far fewer times than every 2 s. Only fewer looks, never a later
# landing seen: a look that finds the power landed already shortens what is learned, and no cache: every 2 s.
POWER_LANDS_KEY = "power-lands:{}:{}"


def _power_recheck_s(host_id: int, want: str, sent: bool) -> float:
    poll = settings.POWER_POLL_S
    if not sent:
        return poll
    try:
        learned = cache.get(POWER_LANDS_KEY.format(host_id, want))
    except Exception:
        return poll
    return max(poll, float(learned) - poll) if learned else poll


def power_landed(host_id: int, want: str, scratch: dict) -> None:
    """The host's power reached `want`, asked for at scratch[want]: remember how long it took (see above). Found
    landed by the first look: it may have landed well before, so half of that is learned."""
    sent = parse_datetime(scratch.get(want) or "")
    if sent is None:
        return
    took = (timezone.now() - sent).total_seconds()
    if took < _power_recheck_s(host_id, want, True) + settings.POWER_POLL_S:
        took /= 2
    try:
        cache.set(POWER_LANDS_KEY.format(host_id, want), round(min(took, settings.POWER_DEADLINE_S), 2),
                  timeout=POWER_LANDS_KEEP_S)
    except Exception:
        pass


POWER_LANDS_KEEP_S = 3600  # a flow powers its host several times within minutes; an hour later it is learned anew


def step_power_on_ramdisk(run: Run) -> dict:
    """One-time boot into the agent's ramdisk (PXE, or virtual media for redfish-virtualmedia://)."""
    _power(run, "on", boot="pxe")
    return {"boot": "ramdisk"}


def step_power_off(run: Run) -> dict:
    _power(run, "off")
    return {}


def step_boot_from_disk(run: Run) -> dict:
    _power(run, "on", boot="disk")
    return {}


def step_agent_lookup(run: Run) -> dict:
    """The agent of this boot looked up. A boot known lost (its configuration refused, or not fetched within
    twice its settle window: the listener was down, the boot path broken) is booted again at once, with a new
    secret and no failure counted, up to BOOT_RACES_BEFORE_REPAIR times in a flow run; a raced one the engine
    boots again itself (engine._boot_raced)."""
    since = parse_datetime(run.data.get("ramdisk_boot_at") or run.flow["step_started_at"])
    session = AgentSession.objects.filter(host=run.host, active=True, created_at__gte=since).first()
    if session is not None:
        return {"boot_id": session.boot_id}
    lost = boot_path.boot_lost(run.host.pk)
    if lost and int(run.data.get("boots_lost") or 0) < settings.BOOT_RACES_BEFORE_REPAIR:
        run.data["boots_lost"] = int(run.data.get("boots_lost") or 0) + 1
        boot_again(run, FLOWS[run.flow["name"]], f"the boot is lost: {lost}; booting again with a new secret")
        raise Waiting("booting again", recheck_s=0.1)
    # Looked at again within the window that tells a lost boot, even if no agent calls.
    raise Waiting("the agent has not called back yet", recheck_s=settings.BOOT_SETTLE_S)


def step_inspect(run: Run) -> dict:
    """The host's inventory, stored on the host; the labels it implies when labels are derived (deriveLabels).
    The BMC's own inventory is read first (out of band, hosts.bmc.client.BMC.inventory) and kept beside the
    agent's (BareMetalHost.bmc_inventory): its drives are a census the agent cannot change (a drive it lists that
    the agent does not name is a deviation: step_sku_check). Inspection mode fast (host_inspection_mode) takes the
    BMC's inventory as the host's and sends the agent no `inspect`; an IPMI BMC lists nothing, so its host is
    inspected by its agent whatever the mode.
    A host's first inspection also records its disks as the inventory of record (hosts/gate/census.py); later ones
    leave the record as it is (a difference is a deviation: step_sku_check)."""
    mode, mode_from = host_inspection_mode(run.host)
    scratch = run.data.setdefault("inspect", {})
    if "bmc_inventory" not in scratch:  # once per flow run: the agent's answer may take several drives
        with _bmc_call(run.bmc, run) as bmc:
            listed = _bmc_call(bmc.inventory, run) if bmc.lists_inventory else None
        scratch["bmc_inventory"] = ({**listed, "read_at": timezone.now().isoformat()} if listed is not None else
                                    {"none": "an IPMI BMC lists no inventory (no CPUs, memory, drives or NICs): the "
                                             "agent's inventory alone, and the inventory of record for the release "
                                             "gate's census"})
        run.save_flow()
    bmc_inventory = scratch["bmc_inventory"]
    fast = mode == InspectionMode.FAST and "none" not in bmc_inventory
    if fast:
        inventory = {k: v for k, v in bmc_inventory.items() if k != "read_at"}
        inventory["disks"] = inventory.get("disks") or []
    else:
        inventory = agent_command(run, "inspect")
        boot_settled(run, "the inventory is kept")  # an inventory of record never comes from a raced boot
    record = BareMetalHost.objects.filter(pk=run.host.pk).values_list("disk_record", flat=True).first()
    if not record:
        # A host inspected before the console kept a record: its earlier inspection, not this boot's, is the record.
        earlier = run.host.inventory if (run.host.inventory or {}).get("disks") else None
        record = record_from(earlier or inventory, by="earlier inspection" if earlier else
                             "out-of-band inspection" if fast else "inspection")
        BareMetalHost.objects.filter(pk=run.host.pk).update(inventory=inventory, disk_record=record,
                                                            bmc_inventory=bmc_inventory)
        run.host.disk_record = record
    else:
        BareMetalHost.objects.filter(pk=run.host.pk).update(inventory=inventory, bmc_inventory=bmc_inventory)
    run.host.inventory, run.host.bmc_inventory = inventory, bmc_inventory
    labels = host_derive_labels(host=run.host)
    bmc_disks = bmc_inventory.get("disks")
    return {"mode": mode, "mode_from": mode_from, "inventory_from": "bmc" if fast else "agent",
            "disks": len(inventory.get("disks") or []), "gpus": len(inventory.get("gpus") or []),
            "bmc": bmc_inventory["none"] if "none" in bmc_inventory else
            f"{len(bmc_disks)} drive(s) listed" if bmc_disks is not None else "no storage listed",
            **({"labels": labels} if labels else {})}


def step_sku_check(run: Run) -> dict:
    """The inventory against the SKU of every NodeType that selects the host (pools/sku.py): a host that
    deviates (a missing GPU, a smaller disk, another firmware) goes to repair with the differences, never to
    the pool as a type it is not. Runs after every inspection (intake, retest)."""
    checked = [t.name for t in node_types_selecting(run.host.labels) if t.sku]
    deviations = host_sku_deviations(run.host)
    if deviations:
        evidence = {"deviations": deviations, "checked": checked}
        if BMC_DRIVES in deviations:  # the two censuses side by side
            evidence["census"] = {"bmc": run.host.bmc_inventory.get("disks"),
                                  "agent": inventory_disks(run.host.inventory)}
        raise StepFailed(f"does not match its SKU: {sku_deviations_text(deviations)}", repair=True,
                         evidence=evidence)
    return {"checked": checked, "conforms": True} if checked else {"skipped": "no NodeType with a SKU selects it"}


def step_inspect_unless_known(run: Run) -> dict:
    """Inspect only a host whose inventory is not known yet (a provision needs it, not a fresh one)."""
    if run.host.inventory:
        return {"skipped": "inventory known"}
    return step_inspect(run)


# --- a flow that wrote nothing: no erase -------------------------------------------------------------
# A provision that failed by its claim's fault before any disk-writing command was queued (fail() marks the move
# `untouched`) left the host as its last gate did: the clean that follows powers it off (or keeps it warm) and
# returns it, without booting the ramdisk anew, erasing or running the health suite. No certificate is made: the
# host's last one stands.

UNTOUCHED = "untouched"
NOTHING_WRITTEN = "nothing was written: no erase needed"


def untouched_begin(run: Run) -> None:
    """A cleaning flow's start: the move that began this state (its Event) says whether the flow run before it
    wrote nothing (fail()). Decided once, kept in run.data for the steps' conditions."""
    moved = (Event.objects.filter(host_id=run.host.pk, kind=EventKind.TRANSITION, to_state=run.host.state,
                                  created_at__gte=run.host.state_changed_at)
             .order_by("-pk").values_list("data", flat=True).first())
    spared = (moved or {}).get(UNTOUCHED)
    if spared:
        run.data[UNTOUCHED] = {**spared, "claim": moved.get("claim"), "claim_reason": moved.get("claim_reason")}


def untouched(run: Run) -> bool:
    return bool(run.data.get(UNTOUCHED))


def written(run: Run) -> bool:
    return not untouched(run)


def unless_untouched(steps: list[Step]) -> list[Step]:
    """The steps, passed over (no trace) in a flow run whose host nothing was written on."""
    def applies(run: Run, step: Step) -> bool:
        return written(run) and step.applies(run)

    return [dataclasses.replace(s, when=lambda run, s=s: applies(run, s)) for s in steps]


def step_no_erase_needed(run: Run) -> dict:
    """In place of the ramdisk boot and the release gate: what the failed flow run did on the host (its agent
    commands: none wrote the disk) and the certificate that still stands."""
    spared = run.data[UNTOUCHED]
    commands = list(HostCommand.objects.filter(host=run.host, flow_id=spared["flow_id"]).order_by("pk")
                    .values_list("name", flat=True))
    certificates = EraseCertificate.objects.filter(host=run.host)
    last = certificates.filter(result="pass").order_by("-created_at", "-pk").first()
    standing = [c.certificate_id for c in certificates.filter(flow_id=last.flow_id).order_by("disk")] if last else []
    return {"reason": NOTHING_WRITTEN, "flow": spared["flow"], "flow_id": spared["flow_id"],
            "failed_at": spared["step"], "claim": spared.get("claim"), "agent_commands": commands,
            "certificates": standing}


def step_erase_metadata(run: Run) -> dict:
    result = agent_command(run, "erase_metadata", {"mib": 2})
    return {"disks": [d.get("name") for d in result.get("disks", [])]}


# --- the release gate: erase → verify → GPU reset → health suite (hosts/gate/cleaning.py decides) ---------

GATE_STEPS = frozenset({"erase", "verify_erase", "gpu_reset", "gpu_state", "health_dcgm", "health_nccl"})


def evidence_trimmed(value, limit: int = 4000):
    """Evidence for the Event log: the structure, with long strings (raw tool output) shortened."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:200] + f" … ({len(value)} characters) … " + value[-limit:]
    if isinstance(value, dict):
        return {k: evidence_trimmed(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [evidence_trimmed(v, limit) for v in value[:64]]
    return value


def run_gate(run: Run) -> dict:
    """The policy and health suite of this flow run, decided at its first gate step and kept."""
    gate = run.data.get("gate")
    if gate is None:
        gate = cleaning.gate_for(run.host, run.claim)
        gate["previous"] = cleaning.previous_use(run.host, run.claim)
        run.data["gate"] = gate
        run.save_flow()
    return gate


def _boot_id(run: Run) -> str:
    session = AgentSession.objects.filter(host=run.host, active=True).first()
    return session.boot_id if session else ""


def _boot_provenance(run: Run) -> dict | None:
    """The ramdisk boot whose agent erased, as the console recorded it (hosts/boot/ramdisk.py): when it was started, how
    and when its configuration was delivered, when its agent looked up."""
    boot = (RamdiskBoot.objects.filter(host=run.host, flow_id=run.flow["id"]).first()
            or RamdiskBoot.objects.filter(host=run.host).first())
    if boot is None:
        return None
    def at(value):
        return value.isoformat() if value else None

    return {"ramdisk_boot": boot.pk, "flow_id": boot.flow_id or None, "started_at": at(boot.created_at),
            "config_delivered_via": boot.delivered_via or None, "config_delivered_at": at(boot.delivered_at),
            "agent_looked_up_at": at(boot.looked_up_at), "agent_boot_id": _boot_id(run) or None}


def _census(run: Run) -> dict:
    """The disks this erase must account for, fixed before the erase command is sent (hosts/gate/census.py): the
    inventory of record and the BMC's own storage view. Taken once per flow run and kept in its data."""
    census = run.data.get("census")
    if census is None:
        with _bmc_call(run.bmc, run) as bmc:
            drives = _bmc_call(bmc.drives, run)
        census = census_take(host=run.host, bmc_drives=drives)
        if not census["disks"]:
            raise StepFailed("no disk of the host is known to the console (no inventory of record, and its BMC "
                             "reports no storage): nothing to hold the agent's erase report against", repair=True,
                             evidence={"census": census})
        run.data["census"] = census
        run.save_flow()
    return census


def _issue_certificates(run: Run, gate: dict, *, erase: dict | None, verify: dict | None) -> list:
    """The signed certificates of this erase; a console that cannot sign fails the gate step with the reason."""
    boot_settled(run, "the erase certificates are signed")  # never from a boot that may be raced
    try:
        return cleaning.issue_certificates(host=run.host, flow_id=run.flow["id"], gate=gate,
                                           previous=gate["previous"], erase=erase, verify=verify,
                                           census=run.data.get("census"), boot=_boot_provenance(run),
                                           boot_id=_boot_id(run))
    except certificates.SigningUnavailable as exc:
        raise StepFailed(str(exc), repair=True, evidence={"verify": verify} if verify else {}) from None


def step_erase(run: Run) -> dict:
    """Plant canaries, fingerprint a sample, erase every disk by the policy (agent: `erase`)."""
    gate = run_gate(run)
    census = _census(run)
    policy = gate["policy"]
    plan = _erase_plan(run, gate, census)
    args = {"erase_id": run.flow["id"], "method": policy["method"], "fallback": policy["fallback"],
            "concurrency": policy["concurrency"], "verify": {"share": policy["verify_share"]},
            "plan": [{"serial": e["serial"], "name": e["disk"], "keep": e["action"] == "keep",
                      "methods": e["methods"]} for e in plan["disks"]]}
    try:
        result = agent_command(run, "erase", args, secret_args={"key": cleaning.canary_key(run.flow["id"])})
    except StepFailed as failure:
        if failure.evidence.get("disks"):
            try:
                certs = _issue_certificates(run, gate, erase=failure.evidence, verify=None)
                failure.evidence = {**failure.evidence, "certificates": [c.pk for c in certs]}
            except StepFailed as unsigned:
                failure.message = f"{failure.message}; {unsigned.message}"
        failure.repair = True
        raise
    run.data["erase"] = result
    run.save_flow()
    return {"policy": policy, "next_owner": plan["next_owner"],
            "plan": [{k: e[k] for k in ("disk", "role", "action", "level", "methods")} for e in plan["disks"]],
            "census": {"source": census["source"], "bmc": census["bmc"],
                       "disks": [d["serial"] or d["name"] for d in census["disks"]]},
            "disks": [{k: d.get(k) for k in ("name", "method", "method_type", "fallback_from",
                                             "bytes_written", "canaries_planted")}
                      for d in result.get("disks", [])]}


def _erase_plan(run: Run, gate: dict, census: dict) -> dict:
    """Which disks this erase keeps and how it erases the others (hosts/gate/plan.py): decided once per flow run,
    after the census and before the erase command. Data it keeps holds the host for its pool (hosts_kept_set)
    from before the command is sent, so that no failure on the way can free the host for another pool."""
    plan = gate.get("plan")
    if plan is None:
        node_type = cleaning.node_type_for(run.host, run.claim)
        plan = erase_plan(host=run.host, claim=run.claim, node_type=node_type, census=census, policy=gate["policy"])
        gate["plan"] = plan
        run.save_flow()
    kept = kept_disks(plan)
    if kept and run.claim is not None:
        hosts_kept_set(host=run.host, pool=run.claim.pool, disks=kept, actor="system:flow")
    return plan


def step_verify_erase(run: Run) -> dict:
    """Read the canaries and the sample back (agent: `verify_erase`); judge; one certificate per disk. The gate
    passes only when every disk of the census (taken before the erase: _census) has a passing certificate under
    the same serial and size, and the agent reported no other disk."""
    gate = run_gate(run)
    key = cleaning.canary_key(run.flow["id"])
    args = {"erase_id": run.flow["id"], "mode": gate["policy"]["verify_mode"],
            "concurrency": gate["policy"]["concurrency"]}
    try:
        result = agent_command(run, "verify_erase", args, secret_args={"key": key})
    except StepFailed as failure:
        failure.repair = True
        raise
    certs = _issue_certificates(run, gate, erase=run.data.get("erase"), verify=result)
    failed = [c for c in certs if c.result != "pass"]
    if failed or not certs:
        why = "; ".join(f"{c.disk}: {', '.join(c.document['verification']['findings'][:2])}" for c in failed)
        raise StepFailed(f"erase verification failed: {why or 'no disk was verified'}", repair=True,
                         evidence={"certificates": [c.pk for c in certs], "verify": result,
                                   "census": run.data.get("census")})
    if not kept_disks(gate.get("plan")):
        hosts_kept_clear(host=run.host, actor="system:flow",
                         reason="every disk erased and verified: no tenant's data is kept on it")
    return {"certificates": [str(c.certificate_id) for c in certs],
            "bytes_read": sum(d.get("bytes_read") or 0 for d in result.get("disks", []))}


def _gpus(run: Run) -> int:
    return run_gate(run)["health"]["expected_gpus"]


def _release_budget(run: Run) -> None:
    """The release tier's budget (NodeType `health.release.budget`, 15m by default) covers its GPU checks
    together (reset, DCGM, NCCL; the erase before them is bounded by its own deadline): timed from the first of
    them, and a gate past it fails at its next check, to repair, as the other tiers do."""
    health = run_gate(run)["health"]
    if health.get("budget_s"):
        _within_budget(run, "release", health)


def _within_budget(run: Run, tier: str, values: dict) -> None:
    """Times the tier from its first check (kept in `values`, saved with the flow); past its budget the step
    fails, to repair."""
    if not values.get("started_at"):
        values["started_at"] = timezone.now().isoformat()
        run.save_flow()
    spent = (timezone.now() - parse_datetime(values["started_at"])).total_seconds()
    if values.get("budget_s") and spent > values["budget_s"]:
        raise StepFailed(f"the {tier} health check ran past its budget of {values['budget']} ({int(spent)}s)",
                         repair=True, evidence={"tier": tier, "spent_s": round(spent, 1)})


def step_gpu_reset(run: Run) -> dict:
    """`nvidia-smi --gpu-reset -i N` for each GPU; refused (and failed) while a process holds one."""
    gate = run_gate(run)
    expected = _gpus(run)
    if not expected:
        return {"skipped": "no GPU on this host or its NodeType"}
    _release_budget(run)
    try:
        result = agent_command(run, "gpu_reset", {"expected_gpus": expected})
    except StepFailed as failure:
        raw = _joined_runs(failure.evidence.get("runs"))
        listed = [g for g in failure.evidence.get("gpus") or [] if "index" in g]
        gpus = {str(g["index"]): {"status": "fail" if g.get("exit_code") else "pass", "reset": g.get("reset"),
                                  "bus": g.get("pci_bus")} for g in listed}
        index_of = {g.get("uuid"): str(g["index"]) for g in listed}
        for proc in failure.evidence.get("processes") or []:
            held = index_of.get(proc.get("gpu_uuid"))
            if held is not None:
                gpus[held].update(status="fail", held_by=f"pid {proc.get('pid')} ({proc.get('process_name')})")
        row = cleaning.record_health(host=run.host, flow_id=run.flow["id"], suite="gpu-reset", gate=gate,
                                     parsed={"verdict": "fail", "reasons": [failure.message.removeprefix("agent: ")],
                                             "gpus": gpus}, raw=raw, thresholds={"expected_gpus": expected})
        failure.repair = True
        failure.evidence = {"health_run": row.pk, **failure.evidence}
        raise
    gpus = {str(g["index"]): {"status": "pass", "reset": g.get("reset"), "bus": g.get("pci_bus")}
            for g in result.get("gpus", [])}
    row = cleaning.record_health(host=run.host, flow_id=run.flow["id"], suite="gpu-reset", gate=gate,
                                 parsed={"verdict": "pass", "reasons": [], "gpus": gpus},
                                 raw=_joined_runs(result.get("runs")), thresholds={"expected_gpus": expected})
    return {"gpus": len(gpus), "health_run": row.pk}


def step_gpu_state(run: Run) -> dict:
    """Every GPU back to its NodeType's state (pools/gpu.py: MIG layout, persistence mode; clocks and power limit
    at their defaults) and its memory read (agent: `gpu_state`). The console judges what was read back
    (hosts/gate/gpu_state.py), whether the agent said it succeeded or not; a GPU not in that state, a reset that
    failed or a report of the wrong shape fails the gate, to repair."""
    gate = run_gate(run)
    expected = _gpus(run)
    if not expected:
        return {"skipped": "no GPU on this host or its NodeType"}
    _release_budget(run)
    # A gate decided by an older console has no "gpu": the NodeType's, as it is now.
    want = gate.get("gpu") or node_type_gpu(cleaning.node_type_for(run.host, run.claim))
    args = {"expected_gpus": expected, "mig_layout": want["migLayout"], "persistence_mode": want["persistenceMode"]}
    failure = None
    try:
        result = agent_command(run, "gpu_state", args)
    except StepFailed as failed:
        failure, result = failed, failed.evidence
    parsed = gpu_state.judge(result, expected_gpus=expected, want=want,
                             failure=failure.message.removeprefix("agent: ") if failure else "")
    actions = result.get("actions") if isinstance(result, dict) and isinstance(result.get("actions"), list) else []
    row = cleaning.record_health(host=run.host, flow_id=run.flow["id"], suite="gpu-state", gate=gate, parsed=parsed,
                                 raw=_joined_runs([r for r in actions if isinstance(r, dict)]),
                                 thresholds={"expected_gpus": expected, "mig_layout": want["migLayout"] or "none",
                                             "persistence_mode": want["persistenceMode"],
                                             "max_retired_pages": gpu_state.MAX_RETIRED_PAGES})
    if parsed["verdict"] != "pass":
        raise StepFailed("GPU state: " + "; ".join(parsed["reasons"][:3]), repair=True,
                         evidence={"health_run": row.pk, "reasons": parsed["reasons"][:20]})
    return {"health_run": row.pk, "gpus": len(parsed["gpus"]), "mig_layout": want["migLayout"] or "none"}


def _joined_runs(runs) -> dict:
    runs = runs or []
    return {"command": "; ".join(r.get("command", "") for r in runs),
            "exit_code": next((r.get("exit_code") for r in runs if r.get("exit_code")), 0 if runs else None),
            "stdout": "\n".join(f"$ {r.get('command')}\n{r.get('stdout', '')}{r.get('stderr', '')}" for r in runs)}


def step_health_dcgm(run: Run) -> dict:
    """`dcgmi diag -r N -j`, judged by hosts.gate.health.parse_dcgmi."""
    gate = run_gate(run)
    level = gate["health"]["dcgm_level"]
    if not _gpus(run) or not level:
        return {"skipped": "no GPU" if not _gpus(run) else "the NodeType runs no DCGM diagnostic"}
    _release_budget(run)
    try:
        raw = agent_command(run, "health_check", {"suite": "dcgm", "level": level})
    except StepFailed as failure:
        failure.repair = True
        raise
    text = raw.get("stdout") or ""
    parsed = health.parse_dcgmi(text if "{" in text else text + "\n" + (raw.get("stderr") or ""), raw.get("exit_code"))
    row = cleaning.record_health(host=run.host, flow_id=run.flow["id"], suite="dcgmi", gate=gate, parsed=parsed,
                                 raw=raw, thresholds={"dcgm_level": level})
    if parsed["verdict"] != "pass":
        raise StepFailed(f"dcgmi diag -r {level}: " + "; ".join(parsed["reasons"][:3]), repair=True,
                         evidence={"health_run": row.pk, "reasons": parsed["reasons"], "gpus": parsed["gpus"]})
    return {"health_run": row.pk, "verdict": "pass", "tests": len(parsed["tests"]), "version": parsed.get("version")}


def step_health_nccl(run: Run) -> dict:
    """`all_reduce_perf` over every GPU, judged on large-message busbw against the NodeType's threshold."""
    gate = run_gate(run)
    threshold = gate["health"]["nccl_min_busbw_gbps"]
    gpus = _gpus(run)
    if not gpus or threshold is None:
        return {"skipped": "no GPU" if not gpus else "the NodeType sets no NCCL threshold"}
    _release_budget(run)
    try:
        raw = agent_command(run, "health_check", {"suite": "nccl", "gpus": gpus, "min_bytes": "1G", "max_bytes": "8G"})
    except StepFailed as failure:
        failure.repair = True
        raise
    parsed = health.parse_nccl((raw.get("stdout") or "") + (raw.get("stderr") or ""), json_text=raw.get("json"),
                               exit_code=raw.get("exit_code"), min_busbw=threshold)
    row = cleaning.record_health(host=run.host, flow_id=run.flow["id"], suite="nccl", gate=gate, parsed=parsed,
                                 raw=raw, thresholds={"min_busbw_gbps": threshold})
    if parsed["verdict"] != "pass":
        raise StepFailed("all_reduce_perf: " + "; ".join(parsed["reasons"][:3]), repair=True,
                         evidence={"health_run": row.pk, "reasons": parsed["reasons"], "busbw_gbps": parsed["busbw_gbps"]})
    _release_budget(run)  # the last check: the tier as a whole within its budget
    return {"health_run": row.pk, "busbw_gbps": parsed["busbw_gbps"], "message_bytes": parsed["message_bytes"]}


# --- the health tiers (pools/health_tiers.py): handover, intake, idle ---------------------------------------
# Each tier is a few steps of the flow it belongs to (provision, inspect and retest, idle_check); a tier the
# host's NodeType does not declare is skipped. Every check leaves a HealthCheckRun tagged with its tier.

def _tier_values(run: Run, tier: str) -> dict | None:
    """The tier's settings for this flow run, decided when first asked and kept (None: not declared)."""
    kept = run.data.setdefault("tiers", {})
    if tier not in kept:
        node_type = cleaning.node_type_for(run.host, run.claim)
        values = node_type_tiers(node_type).get(tier) if node_type is not None else None
        if values is not None:
            gpus = cleaning.gate_for(run.host, run.claim)["health"]["expected_gpus"]
            values = {**values, "node_type": node_type.name, "started_at": None, "expected_gpus": gpus,
                      "sku_gpu": (node_type.sku or {}).get("gpu")}
        kept[tier] = values
        run.save_flow()
    return kept[tier]


def _tier(run: Run, tier: str) -> dict | None:
    """The tier's settings (_tier_values); a tier that ran past its budget fails the step."""
    values = _tier_values(run, tier)
    if values is not None:
        _within_budget(run, tier, values)
    return values


def _tier_record(run: Run, tier: str, values: dict, suite: str, parsed: dict, raw: dict, thresholds: dict):
    return cleaning.record_health(host=run.host, flow_id=run.flow["id"], suite=suite,
                                  gate={"node_type": values["node_type"], "tier": tier}, parsed=parsed, raw=raw,
                                  thresholds=thresholds)


def _tier_dcgm(run: Run, tier: str) -> dict:
    """`dcgmi diag -r N` at the tier's level."""
    values = _tier(run, tier)
    if values is None:
        return {"skipped": f"the NodeType declares no {tier} check"}
    level = values.get("dcgmLevel") or 0
    if not values["expected_gpus"] or not level:
        return {"skipped": "no GPU" if not values["expected_gpus"] else f"the {tier} check runs no DCGM diagnostic"}
    raw = agent_command(run, "health_check", {"suite": "dcgm", "level": level})
    text = raw.get("stdout") or ""
    parsed = health.parse_dcgmi(text if "{" in text else text + "\n" + (raw.get("stderr") or ""), raw.get("exit_code"))
    row = _tier_record(run, tier, values, "dcgmi", parsed, raw, {"dcgm_level": level})
    if parsed["verdict"] != "pass":
        raise StepFailed(f"{tier}: dcgmi diag -r {level}: " + "; ".join(parsed["reasons"][:3]), repair=True,
                         evidence={"tier": tier, "health_run": row.pk, "reasons": parsed["reasons"],
                                   "gpus": parsed["gpus"]})
    return {"tier": tier, "health_run": row.pk, "verdict": "pass", "level": level}


def _tier_gpus(run: Run, tier: str) -> dict:
    """The GPUs the agent sees now, against the SKU's model and count (else the NodeType's GPU count)."""
    values = _tier(run, tier)
    if values is None or not values.get("gpus"):
        return {"skipped": f"the NodeType declares no {tier} GPU inventory check"}
    want = values["sku_gpu"] or ({"count": values["expected_gpus"]} if values["expected_gpus"] else None)
    if not want:
        return {"skipped": "the NodeType states no GPU"}
    inventory = agent_command(run, "inspect")
    boot_settled(run, "the inventory is kept")
    BareMetalHost.objects.filter(pk=run.host.pk).update(inventory=inventory)
    if values["sku_gpu"]:
        reasons = sku_deviations({"gpu": values["sku_gpu"]}, inventory)
    else:
        found = len(inventory.get("gpus") or [])
        reasons = [] if found == want["count"] else [f"GPUs: {found} of {want['count']}"]
    gpus = {str(g.get("index", i)): {"status": "pass", "name": g.get("name")}
            for i, g in enumerate(inventory.get("gpus") or [])}
    parsed = {"verdict": "fail" if reasons else "pass", "reasons": reasons, "gpus": gpus}
    row = _tier_record(run, tier, values, "gpus", parsed, {"command": "inspect", "exit_code": 0}, {"gpu": want})
    if reasons:
        raise StepFailed(f"{tier}: " + "; ".join(reasons), repair=True,
                         evidence={"tier": tier, "health_run": row.pk, "reasons": reasons})
    return {"tier": tier, "health_run": row.pk, "gpus": len(gpus)}


def _tier_links(run: Run, tier: str) -> dict:
    """`nvidia-smi nvlink --status`: every NVLink of every GPU active."""
    values = _tier(run, tier)
    if values is None or not values.get("links"):
        return {"skipped": f"the NodeType declares no {tier} link check"}
    if not values["expected_gpus"]:
        return {"skipped": "no GPU"}
    raw = agent_command(run, "health_check", {"suite": "links"})
    parsed = health.parse_nvlink(raw.get("stdout") or "", raw.get("exit_code"), values["expected_gpus"])
    row = _tier_record(run, tier, values, "nvlink", parsed, raw, {"all_links_active": True})
    if parsed["verdict"] != "pass":
        raise StepFailed(f"{tier}: " + "; ".join(parsed["reasons"][:3]), repair=True,
                         evidence={"tier": tier, "health_run": row.pk, "reasons": parsed["reasons"]})
    return {"tier": tier, "health_run": row.pk, "gpus": len(parsed["gpus"])}


def _tier_burnin(run: Run, tier: str) -> dict:
    """The intake: `dcgmi diag -r 3` (or 4) again and again for the burn-in duration (once when it is 0s)."""
    values = _tier(run, tier)
    if values is None:
        return {"skipped": f"the NodeType declares no {tier} check"}
    if not values["expected_gpus"]:
        return {"skipped": "no GPU"}
    level = values.get("dcgmLevel") or 3
    raw = agent_command(run, "health_check", {"suite": "burnin", "level": level, "seconds": values["burnIn_s"]})
    text = raw.get("stdout") or ""
    parsed = health.parse_dcgmi(text if "{" in text else text + "\n" + (raw.get("stderr") or ""), raw.get("exit_code"))
    parsed["passes"] = raw.get("passes")
    row = _tier_record(run, tier, values, "burn-in", parsed, {**raw, "duration_s": raw.get("seconds")},
                       {"dcgm_level": level, "burn_in_s": values["burnIn_s"]})
    if parsed["verdict"] != "pass":
        raise StepFailed(f"{tier}: burn-in (dcgmi diag -r {level}, pass {raw.get('passes')}): "
                         + "; ".join(parsed["reasons"][:3]), repair=True,
                         evidence={"tier": tier, "health_run": row.pk, "reasons": parsed["reasons"]})
    return {"tier": tier, "health_run": row.pk, "passes": raw.get("passes"), "seconds": raw.get("seconds")}


def tier_steps(tier: str, parts: tuple[str, ...]) -> list[Step]:
    """The tier's checks as steps named `<tier>_<part>` (handover_dcgm, intake_burnin, ...)."""
    functions = {"gpus": _tier_gpus, "links": _tier_links, "dcgm": _tier_dcgm, "burnin": _tier_burnin}
    deadline = deadline_setting("BURNIN_DEADLINE_S") if tier == "intake" else deadline_setting("HEALTH_DEADLINE_S")
    steps = []
    for part in parts:
        def run_part(run: Run, fn=functions[part], tier=tier) -> dict:
            return fn(run, tier)
        def declared(run: Run, part=part, tier=tier) -> bool:
            # A tier (or a check of it) the NodeType does not declare leaves no step behind (no Event).
            values = _tier_values(run, tier)
            return values is not None and (part not in ("gpus", "links") or bool(values.get(part)))

        run_part.__name__ = f"step_{tier}_{part}"
        steps.append(Step(f"{tier}_{part}", run_part, deadline, when=declared))
    return steps


HANDOVER_STEPS = tier_steps("handover", ("gpus", "links", "dcgm"))  # quick ones first
INTAKE_STEPS = tier_steps("intake", ("burnin",))
IDLE_STEPS = tier_steps("idle", ("gpus", "links", "dcgm"))
TIER_STEPS = {step.name: step.name.split("_", 1)[0] for step in (*HANDOVER_STEPS, *INTAKE_STEPS, *IDLE_STEPS)}


def step_reboot_to_disk(run: Run) -> dict:
    agent_command(run, "reboot_to_disk")
    boot_path.agent_sessions_end(host_ids=[run.host.pk])  # that boot is over
    return {}


# The release gate: what a release, a first registration and a retest run between the agent's boot and the
# host's return to the pool. A failure of any of these steps sends the host to repair with the evidence.
CLEANING_STEPS = [
    Step("erase", step_erase, deadline_setting("ERASE_DEADLINE_S")),
    Step("verify_erase", step_verify_erase, deadline_setting("VERIFY_DEADLINE_S")),
    Step("gpu_reset", step_gpu_reset, deadline_setting("AGENT_COMMAND_DEADLINE_S")),
    Step("gpu_state", step_gpu_state, deadline_setting("AGENT_COMMAND_DEADLINE_S")),
    Step("health_dcgm", step_health_dcgm, deadline_setting("HEALTH_DEADLINE_S")),
    Step("health_nccl", step_health_nccl, deadline_setting("HEALTH_DEADLINE_S")),
]

# The flows a host runs for itself. The ones that serve a claim (provision, deprovision) are composed of these
# steps and the claim's own by claims.steps.
RAMDISK_STEPS = [  # into the agent's ramdisk, and what the agent finds
    Step("power_on_pxe", step_power_on_ramdisk, deadline_setting("POWER_STEP_DEADLINE_S"), boots_ramdisk=True),
    Step("agent_lookup", step_agent_lookup, deadline_setting("AGENT_LOOKUP_DEADLINE_S")),
    Step("inspect", step_inspect, deadline_setting("AGENT_COMMAND_DEADLINE_S")),
    Step("sku_check", step_sku_check, lambda: 60.0),  # reads the database only: one drive
]
INSPECT_UNLESS_KNOWN = Step("inspect", step_inspect_unless_known, deadline_setting("AGENT_COMMAND_DEADLINE_S"))
# After a passing gate, where the host's NodeType keeps warm hosts (hosts/flows/warm.py): it may stay on in the
# ramdisk, warm, instead of being powered off. Its timeline then shows keep_warm and no power-off.
KEEP_WARM = Step("keep_warm", step_keep_warm, lambda: 60.0, when=warm_wanted)  # a few queries: a minute is plenty


NO_ERASE_NEEDED = Step("no_erase_needed", step_no_erase_needed, lambda: 60.0, when=untouched)  # reads the database


def power_off_unless_warm(name: str) -> Step:
    return Step(name, step_power_off, deadline_setting("POWER_STEP_DEADLINE_S"), when=not_kept_warm)
