"""Claims served by something other than a host: apps above claims (machines/: an external provider's machine)
register here at start; the claims app asks them, knowing nothing of them."""
from django.db.models import Max, Q

from events.choices import EventKind
from events.models import Event
from hosts.models import EraseCertificate

# fn(claims) → ids of those that hold a machine not gone: they go to Releasing and the machine's app releases them
# once the transaction commits (claims.phases.claims_release).
MACHINE_HOLDERS: list = []
# fn(claim=, action=, actor=, reason=) → True when the claim's machine took the power request (claims API, pages).
MACHINE_POWER: list = []
# fn(claim_ids) → {claim id: what its machine is, as the API and the claim page show it}.
MACHINE_VIEWS: list = []
# The steps of a claim's machine, for the claim's timeline and the fleet's timings: fn(claim) → [{"step",
# "machine", "started_at", "ended_at", "status", "message"}] in MACHINE_STEP_ORDER; fn(recent) → {step: [seconds]}
# over the latest `recent` machines.
MACHINE_STEPS: list = []
MACHINE_STEP_DURATIONS: list = []
MACHINE_FLOW = "machine"
MACHINE_STEP_ORDER = ("make", "join", "release")  # made → running; running → its node Ready; released → gone


def on_machine_release(holders) -> None:
    if holders not in MACHINE_HOLDERS:
        MACHINE_HOLDERS.append(holders)


def on_machine_power(fn) -> None:
    if fn not in MACHINE_POWER:
        MACHINE_POWER.append(fn)


def on_machine_view(fn) -> None:
    if fn not in MACHINE_VIEWS:
        MACHINE_VIEWS.append(fn)


def on_machine_steps(steps, durations) -> None:
    if steps not in MACHINE_STEPS:
        MACHINE_STEPS.append(steps)
    if durations not in MACHINE_STEP_DURATIONS:
        MACHINE_STEP_DURATIONS.append(durations)


def machine_steps(claim) -> list[dict]:
    return [step for fn in MACHINE_STEPS for step in fn(claim)]


def machine_step_durations(recent: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for fn in MACHINE_STEP_DURATIONS:
        for step, values in fn(recent).items():
            found.setdefault(step, []).extend(values)
    return found


def machines_of(claim_ids) -> dict[int, dict]:
    found: dict[int, dict] = {}
    for fn in MACHINE_VIEWS:
        found.update(fn(claim_ids))
    return found


def machine_power(*, claim, action: str, actor: str, reason: str = "") -> bool:
    return any(fn(claim=claim, action=action, actor=actor, reason=reason) for fn in MACHINE_POWER)


REBOOT_ANNOTATION = "machines.vcluster.com/reboot"


def claims_extras(claims) -> dict:
    """What the API shows beside each claim, read for a whole page in a fixed number of queries: its machine (None:
    a host of the console's own), the erase certificates naming it, and when a reboot was last asked."""
    claims = list(claims)
    machines = machines_of([c.pk for c in claims])
    certificates: dict[str, list[int]] = {}
    for pk, name in (EraseCertificate.objects.filter(claim_name__in=[c.name for c in claims]).order_by("pk")
                     .values_list("pk", "claim_name")):
        certificates.setdefault(name, []).append(pk)
    reboots = {}
    asked = Q(kind=EventKind.ACTION, data__action="power-cycle")
    by_claim = (Event.objects.filter(asked, claim_id__in=[c.pk for c in claims]).values("claim_id")
                .annotate(at=Max("created_at")))
    reboots.update({row["claim_id"]: row["at"] for row in by_claim})
    hosted = {c.host_id: c for c in claims if c.host_id}
    by_host = (Event.objects.filter(asked, host_id__in=list(hosted)).values("host_id").annotate(at=Max("created_at")))
    for row in by_host:  # a host's reboot counts for the claim it serves since that claim was made
        claim = hosted[row["host_id"]]
        if row["at"] >= claim.created_at:
            reboots[claim.pk] = max(row["at"], reboots.get(claim.pk, row["at"]))
    return {"machines": {c.pk: machines.get(c.pk) for c in claims}, "certificates": certificates, "reboots": reboots}


def claim_proof(claim, machine: dict | None, certificates: list[int]) -> dict:
    """Which proof exists (or will) that the claim's data is not handed on: the release gate's erase certificates
    for a host; for an external provider's machine, what its kind does with the disks (destroyed with a VM, the
    other Metal3 cluster's cleaning), said plainly."""
    if machine is not None:
        return {"kind": machine["disk_proof"] or machine["expected_proof"],
                "text": machine["disk_proof_text"] or machine["expected_proof_text"],
                "final": bool(machine["disk_proof"]), "certificates": []}
    if certificates:
        return {"kind": "certificate", "text": "erase certificates of the release gate", "final": True,
                "certificates": certificates}
    if claim.host_id or claim.host_name:
        return {"kind": "certificate", "final": False, "certificates": [],
                "text": "the release gate erases and verifies every disk of the host, and signs a certificate, "
                        "before the host serves anyone again"}
    return {"kind": "none", "text": "no machine yet: nothing to erase", "final": False, "certificates": []}
