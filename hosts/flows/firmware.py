"""BIOS settings and firmware over Redfish: the steps that apply a NodeType's BIOS settings and verify them after the
reboot, the firmware inventory, and the firmware update (a servicing flow of its own, registered in .host)."""
# - Intake and provision: `bios_apply` (before the power-on into the ramdisk) reads Systems/<id>/Bios and PATCHes the
#   Settings object with what differs from the NodeType's firmware.settings; the power-on that follows is the reboot
#   that applies them (_power powers a host that is on off first). `bios_verify` (once the agent of that boot looked
#   up) reads them again: a setting that did not stick sends the host to repair with wanted / actual / pending.
# - `firmware_inventory` records UpdateService/FirmwareInventory on the host (Metal3's HostFirmwareComponents status);
#   the host page holds it against the NodeType's minimums (pools/firmware.py).
# - The firmware update: an admin asks for it on an available host (hosts.services.host_firmware_update moves it to
#   servicing); SimpleUpdate is sent once, its task followed until it ends, the host powered off (the new firmware
#   runs from its next boot) and the inventory read again. A failed update goes to repair with the task's messages.
from django.conf import settings
from django.utils import timezone

from events.choices import EventKind
from events.models import Event
from pools.firmware import component_name, settings_differences, wanted_settings

from hosts.bmc.client import BMCError, is_ipmi
from hosts.engine.drive import step_retry
from hosts.engine.flow import SKIP, Run, Step, StepFailed, Waiting, deadline_setting
from hosts.gate import cleaning
from hosts.models import BareMetalHost

from .steps import _bmc_call, step_power_off

IPMI_REFUSAL = ("an ipmi:// BMC cannot read or change BIOS settings or firmware (Redfish's Bios and UpdateService): "
                "give this host a Redfish address")
# Steps whose failure (with repair=True) sends the host to repair with the evidence in any flow, not only a gate's.
TO_REPAIR_STEPS = frozenset({"bios_apply", "bios_verify", "firmware_update_wait", "firmware_update_verify"})
TASK_RUNNING = frozenset({"New", "Starting", "Running", "Pending", "Suspended", "Stopping", "Service"})
TASK_DONE = "Completed"


def _ipmi(run: Run) -> bool:
    return is_ipmi(run.host.bmc_address)


def _record(run: Run, **values) -> dict:
    """Merge what the BMC said into the host's firmware record (read fresh: the flow holds the host's lease)."""
    record = BareMetalHost.objects.filter(pk=run.host.pk).values_list("firmware", flat=True).first() or {}
    record = {**record, **values}
    BareMetalHost.objects.filter(pk=run.host.pk).update(firmware=record)
    run.host.firmware = record
    return record


def _record_settings(run: Run, read: dict) -> None:
    _record(run, settings=read["attributes"], pending=read["pending"], settings_read_at=timezone.now().isoformat())


def components_recorded(run: Run, items: list[dict], **marks) -> list[dict]:
    """The inventory as Metal3's status.components: each item's initialVersion is the first version the console saw;
    `marks` ({component: {...}}) adds lastVersionFlashed and updatedAt to the ones an update just changed."""
    before = {c["component"]: c for c in (run.host.firmware or {}).get("components") or []}
    components = []
    for item in items:
        name = component_name(item["id"], item["name"])
        old = before.get(name, {})
        row = {"component": name, "id": item["id"], "name": item["name"], "path": item["path"],
               "currentVersion": item["version"], "initialVersion": old.get("initialVersion") or item["version"],
               "updateable": item["updateable"],
               **{k: old[k] for k in ("lastVersionFlashed", "updatedAt") if k in old}, **marks.get(name, {})}
        components.append(row)
    _record(run, components=components, components_read_at=timezone.now().isoformat())
    return components


# --- BIOS settings: at intake and before a provision ------------------------------------------------------

def _wanted(run: Run) -> dict:
    """The NodeType's BIOS settings for this flow run ({name: value as written}), decided at its first ask and kept."""
    kept = run.data.get("bios_wanted")
    if kept is None:
        node_type = cleaning.node_type_for(run.host, run.claim)
        kept = dict(((node_type.firmware or {}).get("settings") or {}) if node_type is not None else {})
        run.data["bios_wanted"] = kept
        run.save_flow()
    return kept


def bios_declared(run: Run) -> bool:
    """Where the host's NodeType declares no BIOS settings the steps leave no trace."""
    return bool(_wanted(run))


def step_bios_apply(run: Run) -> dict:
    """Read the BIOS; PATCH its Settings with what differs from the NodeType's (once: a change already pending is not
    sent again). The reboot that applies them is the power-on that follows."""
    if _ipmi(run):
        raise StepFailed(IPMI_REFUSAL)
    wanted = _wanted(run)
    as_text = wanted_settings({"settings": wanted})
    with _bmc_call(run.bmc, run) as bmc:
        read = _bmc_call(bmc.bios_attributes, run)
        _record_settings(run, read)
        missing = sorted(name for name in wanted if name not in read["attributes"])
        if missing:
            raise StepFailed(f"the BIOS has no attribute {', '.join(missing)}", repair=True,
                             evidence={"bios": {"wanted": as_text, "missing": missing,
                                                "attributes": sorted(read["attributes"])}})
        to_send = settings_differences(as_text, {**read["attributes"], **read["pending"]})
        if to_send:
            _bmc_call(lambda: bmc.bios_apply({name: wanted[name] for name in to_send}), run)
    changed = settings_differences(as_text, read["attributes"])
    run.data["bios_changed"] = sorted(changed)
    run.save_flow()
    if not changed:
        return {"in_force": sorted(wanted)}
    return {"changed": changed, "applies_at": "the reboot into the ramdisk"}


def step_bios_verify(run: Run) -> dict:
    """After the reboot: every wanted setting in force, or to repair with wanted / actual / pending."""
    wanted = wanted_settings({"settings": _wanted(run)})
    with _bmc_call(run.bmc, run) as bmc:
        read = _bmc_call(bmc.bios_attributes, run)
    _record_settings(run, read)
    off = settings_differences(wanted, read["attributes"])
    if off:
        text = "; ".join(f"{name}: wanted {d['wanted']}, is {d['actual']}" for name, d in off.items())
        raise StepFailed(f"BIOS settings did not stick after the reboot: {text}", repair=True,
                         evidence={"bios": {"wanted": wanted, "actual": {n: read["attributes"].get(n) for n in wanted},
                                            "pending": read["pending"], "not_applied": off,
                                            "changed": run.data.get("bios_changed") or []}})
    return {"verified": sorted(wanted), "changed": run.data.get("bios_changed") or []}


def step_firmware_inventory(run: Run) -> dict:
    """The BMC's firmware inventory, recorded on the host. A BMC without one (no UpdateService) is recorded as such;
    the step does not fail for it."""
    try:
        with run.bmc() as bmc:
            items = bmc.firmware_inventory()
    except BMCError as exc:
        if exc.transient:
            raise step_retry(run, str(exc), recheck_s=settings.BMC_RETRY_S) from None
        _record(run, components=[], components_error=str(exc), components_read_at=timezone.now().isoformat())
        return {"skipped": f"no firmware inventory: {exc}"}
    components = components_recorded(run, items)
    return {"components": {c["component"]: c["currentVersion"] for c in components}}


def not_ipmi(run: Run) -> bool:
    return not _ipmi(run)


BIOS_APPLY = Step("bios_apply", step_bios_apply, deadline_setting("POWER_STEP_DEADLINE_S"), when=bios_declared)
BIOS_VERIFY = Step("bios_verify", step_bios_verify, deadline_setting("POWER_STEP_DEADLINE_S"), when=bios_declared)
# A BMC whose inventory stays away past the deadline does not keep the host from the pool: the step is skipped.
FIRMWARE_INVENTORY = Step("firmware_inventory", step_firmware_inventory, deadline_setting("POWER_STEP_DEADLINE_S"),
                          on_deadline=SKIP, when=not_ipmi)


# --- the firmware update: a servicing flow --------------------------------------------------------------------

def firmware_update_begin(run: Run) -> None:
    """The request (component, image URL, who asked) as the move into servicing recorded it: kept in run.data."""
    moved = (Event.objects.filter(host_id=run.host.pk, kind=EventKind.TRANSITION, to_state=run.host.state,
                                  created_at__gte=run.host.state_changed_at)
             .order_by("-pk").values_list("data", flat=True).first()) or {}
    run.data["update"] = dict(moved.get("firmware_update") or {})


def _request(run: Run) -> dict:
    update = run.data.get("update") or {}
    if not update.get("component") or not update.get("image_url"):
        raise StepFailed("no firmware update was asked for (component and image URL missing)")
    return update


def step_firmware_update_send(run: Run) -> dict:
    """SimpleUpdate of the component from the image URL, sent once (recorded before it goes, as a power change is)."""
    update = _request(run)
    if _ipmi(run):
        raise StepFailed(IPMI_REFUSAL)
    scratch = run.data.setdefault("firmware_update_send", {})
    if scratch.get("task"):
        return {"task": scratch["task"], "before": scratch["before"]}
    with _bmc_call(run.bmc, run) as bmc:
        items = _bmc_call(bmc.firmware_inventory, run)
        components = components_recorded(run, items)
        target = next((c for c in components if c["component"] == update["component"]), None)
        if target is None:
            raise StepFailed(f"the BMC lists no firmware component {update['component']} (it has "
                             f"{', '.join(c['component'] for c in components) or 'none'})")
        if not target["updateable"]:
            raise StepFailed(f"the BMC says {update['component']} cannot be updated")
        if scratch.get("sending"):
            # A drive that died after asking and before recording the task: asking again could flash twice.
            raise StepFailed("the update was sent but its task was not recorded: look at the BMC before asking again")
        scratch.update(sending=timezone.now().isoformat(), before=target["currentVersion"], target=target["path"])
        run.save_flow()
        try:
            task = _bmc_call(lambda: bmc.firmware_update(update["image_url"], target["path"]), run)
        except (Waiting, StepFailed):  # the BMC did not take it (away, refused): the next try sends it
            scratch.pop("sending", None)
            run.save_flow()
            raise
    scratch["task"] = task
    run.save_flow()
    return {"component": update["component"], "image_url": update["image_url"], "task": task,
            "before": target["currentVersion"]}


def step_firmware_update_wait(run: Run) -> dict:
    """The update's task until it ends: Completed goes on; any other end fails the update, to repair, with the task's
    own messages."""
    update = _request(run)
    sent = run.data.get("firmware_update_send") or {}
    with _bmc_call(run.bmc, run) as bmc:
        task = _bmc_call(lambda: bmc.firmware_task(sent["task"]), run)
    if task["state"] in TASK_RUNNING:
        raise Waiting(f"the update of {update['component']} runs ({task['percent'] or 0}%)",
                      recheck_s=settings.FIRMWARE_POLL_S)
    if task["state"] != TASK_DONE:
        why = "; ".join(m for m in task["messages"] if m) or task["state"]
        raise StepFailed(f"firmware update of {update['component']} failed: {why}", repair=True,
                         evidence={"firmware_update": {**update, "task": sent["task"], "task_state": task["state"],
                                                       "task_status": task["status"], "messages": task["messages"],
                                                       "before": sent.get("before")}})
    return {"task": sent["task"], "state": task["state"], "messages": task["messages"]}


def step_firmware_update_verify(run: Run) -> dict:
    """The inventory read again: the component's version changed, or the update did not take (to repair)."""
    update = _request(run)
    sent = run.data.get("firmware_update_send") or {}
    with _bmc_call(run.bmc, run) as bmc:
        items = _bmc_call(bmc.firmware_inventory, run)
    now = timezone.now().isoformat()
    versions = {component_name(i["id"], i["name"]): i["version"] for i in items}
    after = versions.get(update["component"])
    if not after or after == sent.get("before"):
        components_recorded(run, items)
        raise StepFailed(f"firmware update of {update['component']}: the BMC reported success, but the version is "
                         f"still {after or 'not reported'}", repair=True,
                         evidence={"firmware_update": {**update, "task": sent.get("task"), "before": sent.get("before"),
                                                       "after": after}})
    components_recorded(run, items, **{update["component"]: {"lastVersionFlashed": after, "updatedAt": now}})
    return {"component": update["component"], "before": sent.get("before"), "after": after}


FIRMWARE_UPDATE_STEPS = [
    Step("firmware_update_send", step_firmware_update_send, deadline_setting("POWER_STEP_DEADLINE_S")),
    Step("firmware_update_wait", step_firmware_update_wait, deadline_setting("FIRMWARE_UPDATE_DEADLINE_S")),
    # Off: the new firmware runs from the host's next boot (its next flow powers it on).
    Step("power_off", step_power_off, deadline_setting("POWER_STEP_DEADLINE_S")),
    Step("firmware_update_verify", step_firmware_update_verify, deadline_setting("POWER_STEP_DEADLINE_S")),
]
