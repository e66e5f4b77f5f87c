"""A flow and its steps, as the apps declare them, and the Run a step is given: the host, its flow record
and the claim it serves."""
from dataclasses import dataclass, field
from typing import Callable

from django.conf import settings
from django.utils.dateparse import parse_datetime

from hosts.bmc.client import BMC
from hosts.bmc.factory import host_bmc
from hosts.models import BareMetalHost


class Waiting(Exception):
    """The step waits for something outside; drive again after `recheck_s` (or when it happens)."""

    def __init__(self, why: str = "", recheck_s: float | None = None):
        super().__init__(why)
        self.recheck_s = recheck_s


class StepFailed(Exception):
    """The step cannot succeed. `clean`: the disks may hold a tenant's data or half an image, so the
    host is cleaned (deprovisioned) rather than parked in error. `repair`: the release gate failed (erase,
    verification, GPU reset, health suite): the host goes to the repair pool with `evidence`.
    `claim_reason`: the claim caused it (its image, its tenant), not the host: the host is cleaned and the
    failure not held against it (HOST_FAILURE_LIMIT), and the claim fails with this reason."""

    def __init__(self, message: str, *, clean: bool = False, repair: bool = False, evidence: dict | None = None,
                 claim_reason: str = ""):
        super().__init__(message)
        self.message, self.clean, self.repair, self.evidence = message, clean, repair, evidence or {}
        self.claim_reason = claim_reason


FAIL, SKIP = "fail", "skip"


@dataclass
class Step:
    """`on_deadline`: what the flow does with a step that has not finished within `deadline_s` (or failed):
    FAIL the flow (the flow's `fail` sends the host to its failure state), or SKIP it with the reason recorded
    and go on (a release's drain and delete: the tenant's API must not keep a host from its erase).
    `when`: the step runs only where when(run) is true; elsewhere it is passed over without a trace (no Event,
    nothing on the timeline): a warm host's provision has no power-on, network boot or lookup at all."""

    name: str
    run: Callable[["Run"], dict | None]
    deadline_s: Callable[[], float]
    on_deadline: str = FAIL
    when: Callable[["Run"], bool] | None = None
    boots_ramdisk: bool = False  # powers the host into the agent's ramdisk: where a void boot starts again

    def applies(self, run: "Run") -> bool:
        return self.when is None or bool(self.when(run))


@dataclass
class Flow:
    """A host's flow in one state, registered with hosts.lifecycle.register_flow. `finish(run)` and
    `fail(run, step, failure)` are the flow's own hooks that move the host on (hosts.flows.host gives the host
    flows theirs); `done_state`, `clean_state` and `gate` are theirs to read; `after_step` runs a function once a
    step is done; `related`: the host's relations a step reads (loaded with the host, one query); `begin(run)`
    runs once when a run of the flow starts, before its first step (what it writes in run.data is kept)."""

    name: str
    state: str
    steps: list[Step]
    finish: Callable[["Run"], None]
    fail: Callable[["Run", Step, "StepFailed"], None]
    done_state: str = ""
    clean_state: str = ""
    gate: bool = False
    after_step: dict[str, Callable[["Run"], None]] = field(default_factory=dict)
    related: tuple[str, ...] = ()
    begin: Callable[["Run"], None] | None = None


def deadline_setting(name: str) -> Callable[[], float]:
    """A step deadline read from settings when it is checked (tests and workers may change it)."""
    return lambda: getattr(settings, name)



class Run:
    """One drive of one host: the host row, its flow record and the claim it serves, if any (the reverse
    side of the claim's link to its host; the engine only reads it for the Event log)."""

    def __init__(self, host: BareMetalHost, unsaved: bool = False):
        self.host = host
        self.flow = host.flow
        self.claim = getattr(host, "claim", None)
        self.unsaved = unsaved  # the flow record holds a change not written yet (hosts.engine.drive)

    @property
    def data(self) -> dict:
        return self.flow.setdefault("data", {})

    def step_started_at(self):
        return parse_datetime(self.flow["step_started_at"])

    def bmc(self) -> BMC:
        return host_bmc(self.host, kept=True)

    def save_flow(self) -> None:
        # Only while the host is still in the state this flow serves: a drive of a flow that was pre-empted (an
        # idle check a claim took over) must not overwrite the new flow's record.
        since = self.flow.get("state_since")
        match = {"state_changed_at": parse_datetime(since)} if since else {}
        BareMetalHost.objects.filter(pk=self.host.pk, **match).update(flow=self.flow)
        self.unsaved = False

    def save_unsaved(self) -> None:
        if self.unsaved:
            self.save_flow()
