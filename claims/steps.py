"""The flows that serve a claim, provision and deprovision: the claim's steps composed with the host's own."""
# The flows that serve a claim, provision and deprovision: the claim's steps (image, cloud-init seed with the
# tenant's join command, the node in the tenant's API: Ready, labels, taints; on release drain and delete)
# composed with the host's own (hosts.flows: power, the agent's ramdisk, the release gate) and registered with
# the step engine (hosts.engine) when the claims app is ready.
import dataclasses
import logging
import math
from types import SimpleNamespace

import yaml
from django.conf import settings
from django.utils import timezone

from hosts.choices import HostState
from hosts.engine.agent import DISK_WRITTEN, agent_command
from hosts.engine.drive import step_retry
from hosts.engine.flow import SKIP, Run, Step, StepFailed, Waiting, deadline_setting
from hosts.flows.firmware import BIOS_APPLY, BIOS_VERIFY
from hosts.flows.host import host_flow
from hosts.flows.steps import (
    CLEANING_STEPS,
    HANDOVER_STEPS,
    INSPECT_UNLESS_KNOWN,
    KEEP_WARM,
    NO_ERASE_NEEDED,
    RAMDISK_STEPS,
    power_off_unless_warm,
    step_boot_from_disk,
    step_power_off,
    step_reboot_to_disk,
    unless_untouched,
    untouched_begin,
)
from hosts.flows.warm import warm_session
from hosts.models import CommandStatus, HostCommand
from hosts.selectors import image_write_failures
from pools.choices import FabricKind
from pools.fabric import FabricRangeFull, fabric_partitions_assign
from pools.validators import parse_duration

from .choices import ClaimPhase as P
from .drift import image_written
from .ipam import claim_address, claim_environment, network_data_override
from .models import NodeClaim
from .selectors import claim_image
from .phases import claims_transition
from .tenant_api import TenantAPI, TenantAPIError
from .tenant_check import (
    CHECK_STEP,
    WAIT_REASON,
    TargetError,
    tenant_api_target,
    unreachable_message,
)

log = logging.getLogger(__name__)


def _claim(run: Run) -> NodeClaim:
    if run.claim is None:
        raise StepFailed("the host serves no claim")
    return run.claim


def _tenant_api(claim: NodeClaim) -> TenantAPI:
    if not claim.tenant.kubeconfig:
        raise StepFailed(f"tenant {claim.tenant.name} has no API credentials (kubeconfig)",
                         claim_reason="NoTenantCredentials")
    return TenantAPI(claim.tenant.kubeconfig, timeout=settings.TENANT_API_TIMEOUT_S)


def step_check_tenant_api(run: Run) -> dict:
    """Before anything is written: can this server reach the tenant API's VIP (TCP, and TLS with the tenant's
    CA)? The agent checks from the server's network. A failure is the tenant's, not the host's (claim_reason):
    the host is back in the pool, uncounted against HOST_FAILURE_LIMIT and the claim's tries, and without an erase
    (nothing was written: hosts.flows.steps.untouched_begin); the claim waits with the reason
    (claims.tenant_check.tenant_api_holds) until the VIP or CA is fixed."""
    claim = _claim(run)
    if not claim.tenant.kubeconfig:  # the claim fails as write_seed would fail it, before a disk is touched
        _tenant_api(claim)
    try:
        target = tenant_api_target(claim.tenant)
    except TargetError as exc:
        raise StepFailed(f"tenant API: {exc}", claim_reason=WAIT_REASON) from None
    args = {"host": target["host"], "port": target["port"], "tls": target["tls"], "ca_data": target["ca_data"],
            "timeout_s": settings.TENANT_API_CHECK_TIMEOUT_S}
    try:
        result = agent_command(run, "check_endpoint", args, tenant_secret=True)  # the tenant's CA
    except StepFailed as failure:
        if run.data.get("warm") and failure.message.startswith("the agent stopped answering"):
            raise _warm_lost(run, failure.message) from None
        if not failure.evidence.get("kind"):
            raise  # the agent itself failed (silent, crashed): the host's business, as for any command
        raise StepFailed(unreachable_message(target["endpoint"], failure.evidence["reason"]),
                         claim_reason=WAIT_REASON, evidence=failure.evidence) from None
    return {"endpoint": target["endpoint"], "tls": target["tls"], "ca": bool(target["ca_data"]),
            "elapsed_ms": result.get("elapsed_ms")}


def step_write_image(run: Run) -> dict:
    claim = _claim(run)

    def make_args():
        # The image is checked once, when its command is queued; the drives that follow only read the command (its
        # check, with the image's failures on other hosts, was a tenth of the workers' CPU when made on each).
        image, problem = claim_image(claim)
        if problem:  # checked before allocating; the image changed since
            raise StepFailed(problem[1], claim_reason=problem[0])
        run.data[QUEUED_IMAGE] = {"name": image.name, "url": image.url, "checksum": image.checksum}
        return {"url": image.url, "checksum": image.checksum, "checksum_type": image.checksum_type,
                "format": image.format, "root_device_hints": run.host.root_device_hints, "image": image.name}, None

    try:
        result = agent_command(run, "write_image", make_args=make_args, dirties_disk=True)
    except StepFailed as failure:
        if failure.claim_reason:  # the image's own problem, found before anything was queued
            raise
        image = _queued_image(run, claim)
        # Kept on the failure's Event (hosts.selectors.image_write_failures): an image that fails on
        # IMAGE_FAILURE_HOSTS distinct hosts is the claim's fault, not theirs.
        failure.evidence = {**failure.evidence, "image": image.name, "image_url": image.url,
                            "image_checksum": image.checksum}
        failed = {**image_write_failures(name=image.name, url=image.url, checksum=image.checksum),
                  run.host.name: failure.message}
        if len(failed) >= settings.IMAGE_FAILURE_HOSTS:
            failure.claim_reason = "ImageFailed"
            failure.message = (f"OS image {image.name} failed to write on {len(failed)} hosts "
                               f"({', '.join(sorted(failed))}): {failure.message}")
        raise
    image = _queued_image(run, claim)
    image_written(claim=claim, image=image)
    return {"image": image.name, "image_url": image.url, "image_checksum": image.checksum,
            "bytes": result.get("bytes_written"), "disk": result.get("disk")}


QUEUED_IMAGE = "write_image_queued"  # run.data: the image (name, url, checksum) that the write_image command writes


def _queued_image(run: Run, claim: NodeClaim) -> SimpleNamespace:
    """The image the run's write_image command was queued with (a run whose record lacks it: the claim's image)."""
    queued = run.data.get(QUEUED_IMAGE)
    if queued:
        return SimpleNamespace(**queued)
    image, problem = claim_image(claim)
    if image is None:
        raise StepFailed(problem[1], claim_reason=problem[0])
    return image


def step_write_seed(run: Run) -> dict:
    claim = _claim(run)

    def make_args():
        # Network I/O (the tenant API) happens once per flow run: the command, with the token, is kept.
        # The address was taken with the host (claims.ipam); an override's network data goes in as written.
        override = network_data_override(run.host, claim_environment(claim))
        if override:
            # Written as given, but the tenant still holds its fabric partition: the switch tool reads the record.
            claim_fabric_partitions(run.host)
        network = override or network_config(run.host, claim_address(claim))
        api = _tenant_api(claim)
        try:
            token = api.create_bootstrap_token(ttl_s=settings.BOOTSTRAP_TOKEN_TTL_S,
                                               description=f"vmetal join for {claim.name}")
            command, _ = api.join(claim.tenant.join_mode, claim.tenant.api_endpoint or api.server.split("://", 1)[-1],
                                  token.token)
        except TenantAPIError as exc:
            raise step_retry(run, str(exc), recheck_s=5) from None
        except ValueError as exc:  # the tenant's fault (a kubeadm join with no CA to pin), not the host's
            raise StepFailed(f"join command: {exc}", claim_reason=f"join command: {exc}") from None
        node = run.host.name
        NodeClaim.objects.filter(pk=claim.pk).update(node_name=node, bootstrap_token_id=token.id)
        user_data = "#cloud-config\n" + yaml.safe_dump({"hostname": node, "runcmd": [command]}, sort_keys=False)
        meta_data = yaml.safe_dump({"instance-id": claim.name, "local-hostname": node}, sort_keys=False)
        return {"disk": ""}, {"user_data": user_data, "meta_data": meta_data,
                              "network_config": network}

    agent_command(run, "write_seed", make_args=make_args, dirties_disk=True, tenant_secret=True)
    return {"node": run.host.name}


def network_config(host, address) -> str:
    """cloud-init network config v2: the node's static address from its NodeEnvironment, else DHCP; and its
    tenant's fabric partition (claim_fabric_partitions)."""
    partitions = claim_fabric_partitions(host)
    nic = {"match": {"macaddress": host.boot_mac}, "set-name": "eth0"}
    if address is None:
        nic["dhcp4"] = True
    else:
        interface, network = address
        nic.update({"addresses": [f"{interface}/{network.interface.network.prefixlen}"],
                    "routes": [{"to": "default", "via": str(network.gateway)}]})
        if network.dns:
            nic["nameservers"] = {"addresses": network.dns}
    config = {"version": 2, "ethernets": {"eth0": nic}}
    vlan = next((p for p in partitions if p.kind == FabricKind.VLAN), None)
    if vlan is not None:
        # The tenant's VLAN, tagged on the boot NIC, without an address: the fabric's own addressing (the
        # tenant's CNI, its RDMA tooling) is the tenant's.
        config["vlans"] = {f"vlan{vlan.value}": {"id": vlan.value, "link": "eth0"}}
    # Every partition also as a comment line the first boot reads from the seed (`grep '^# vmetal.dev/fabric-'`):
    # netplan has no InfiniBand partitions, so a P_Key is carried only there.
    notes = "".join(f"# vmetal.dev/fabric-{p.kind}: {p.value_text}\n" for p in partitions)
    return notes + yaml.safe_dump(config, sort_keys=False)


def claim_fabric_partitions(host) -> list:
    """The fabric partitions of the tenant the host's claim serves, taken now when this is the tenant's first
    node (pools.fabric); none where no range is configured. A range with no value left: the host is cleaned
    and the claim waits (the allocator holds it Pending with the reason until a tenant frees a value)."""
    claim = NodeClaim.objects.select_related("tenant").filter(host=host).first()
    if claim is None:
        return []
    try:
        return fabric_partitions_assign(tenant=claim.tenant, provider_id=claim.provider_id, actor="system:flow")
    except FabricRangeFull as exc:
        raise StepFailed(str(exc), clean=True) from None


def step_node_ready(run: Run) -> dict:
    claim = _claim(run)
    api = _tenant_api(claim)
    node_name = claim.node_name or run.host.name
    try:
        # One look, not a watch: a watch held a worker thread per joining node (16 threads, 200 nodes).
        node = api.wait_node_ready(node_name, deadline_s=0)
    except TenantAPIError as exc:
        raise Waiting(str(exc), recheck_s=settings.NODE_READY_POLL_S) from None
    return {"node": node_name, "kubelet": node.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", "")}


def step_node_labels(run: Run) -> dict:
    claim = _claim(run)
    labels = {**claim.node_labels, "vmetal.dev/claim": claim.name, "vmetal.dev/pool": claim.pool_name}
    if claim.node_type:
        labels["vcluster.com/node-type"] = claim.node_type.name
    try:
        _tenant_api(claim).set_node_labels_and_taints(claim.node_name or run.host.name, labels, claim.taints)
    except TenantAPIError as exc:
        raise step_retry(run, str(exc), recheck_s=2) from None
    return {"labels": sorted(labels), "taints": len(claim.taints)}


def _release_call(run: Run, what: str, fn) -> dict:
    """Drain and delete try until DRAIN_DEADLINE_S; then they are skipped with the reason and the host is cleaned
    all the same (their steps' deadline policy, hosts.flows). A tenant without credentials (deleted) is skipped."""
    claim = run.claim
    if claim is None or not (claim.node_name or claim.bootstrap_token_id):
        return {"skipped": "no node joined"}
    if not claim.tenant.kubeconfig:
        return {"skipped": "tenant has no API credentials"}
    try:
        return fn(_tenant_api(claim), claim) or {}
    except TenantAPIError as exc:
        log.warning("%s of %s: %s", what, claim.node_name, exc)
        raise step_retry(run, str(exc), recheck_s=settings.DRAIN_POLL_S) from None


def step_drain_node(run: Run) -> dict:
    """Cordon once, then one drain pass per drive until no pod is left (level-triggered, as hosts.flows.steps._power):
    no drive waits for pods to terminate or for a disruption budget. What each pass found is kept on the row
    (`run.data["drain_node"]`) and, at the step's deadline, is the reason it was skipped."""
    def drain(api, claim):
        if not claim.node_name:
            return {"note": "no node: nothing to drain"}
        scratch = run.data.setdefault("drain_node", {})
        if not scratch.get("cordoned"):
            try:
                api.cordon(claim.node_name)
            except TenantAPIError as exc:
                if exc.status != 404:
                    raise
                return {"node": claim.node_name, "note": "not in the tenant API (never joined): nothing to drain"}
            scratch["cordoned"] = timezone.now().isoformat()
            run.save_flow()
        grace = _grace_period_s(claim)
        found = api.drain(claim.node_name, grace_period_s=grace)
        evicted = sorted(set(scratch.get("evicted", [])) | set(found["evicting"]))
        if not found["left"]:
            return {"node": claim.node_name, "evicted": evicted, "grace_period_s": grace}
        scratch.update(passes=scratch.get("passes", 0) + 1, evicted=evicted, left=found["left"],
                       refused=found["refused"], at=timezone.now().isoformat())
        left = ", ".join(found["left"][:5])
        refused = "; ".join(f"{pod}: {why}" for pod, why in list(found["refused"].items())[:3])
        raise step_retry(run, f"{len(found['left'])} pod(s) still on {claim.node_name}: {left}"
                         + (f"; eviction refused: {refused}" if refused else ""), recheck_s=settings.DRAIN_POLL_S)

    return _release_call(run, "drain", drain)


def step_delete_node(run: Run) -> dict:
    def delete(api, claim):
        # The join token first: whatever happens to the node, nothing may join the tenant with it again.
        done = {"token": join_token_revoke(api, claim)} if claim.bootstrap_token_id else {}
        if claim.node_name:
            deleted = api.delete_node(claim.node_name)
            done.update(node=claim.node_name, **({} if deleted else {"note": "the node was not in the tenant API"}))
        return done

    return _release_call(run, "delete", delete)


def join_token_revoke(api: TenantAPI, claim: NodeClaim) -> str:
    """Delete the claim's bootstrap token in its tenant's API and forget it; "deleted" or "already gone"."""
    token_id = claim.bootstrap_token_id
    deleted = api.delete_bootstrap_token(token_id)
    NodeClaim.objects.filter(pk=claim.pk, bootstrap_token_id=token_id).update(bootstrap_token_id="")
    claim.bootstrap_token_id = ""
    return "deleted" if deleted else "already gone"


def claim_revoke_join_token(*, claim_id: int, token_id: str) -> None:
    """A token left behind by a claim that lost its host (claims.phases.claim_host_lost), deleted by a task."""
    claim = NodeClaim.objects.select_related("tenant").filter(pk=claim_id).first()
    if claim is None or not claim.tenant.kubeconfig:
        return
    TenantAPI(claim.tenant.kubeconfig, timeout=settings.TENANT_API_TIMEOUT_S).delete_bootstrap_token(token_id)


def _grace_period_s(claim: NodeClaim) -> int | None:
    """Each eviction's grace period: the pool's terminationGracePeriod in whole seconds, rounded up (`0s`: at
    once); unset: DRAIN_GRACE_S; `Never`: None, each pod's own terminationGracePeriodSeconds."""
    value = claim.pool.termination_grace_period if claim.pool else ""
    if not value:
        return settings.DRAIN_GRACE_S
    duration = parse_duration(value)  # validated when the pool was saved
    return None if duration is None else math.ceil(duration.total_seconds())


def claim_joining(run: Run) -> None:
    claim = run.claim
    if claim is not None and claim.phase == P.PROVISIONING:
        claims_transition(claims=[claim], to_phase=P.JOINING, actor="system:flow", reason="Provisioned",
                          message=f"{run.host.name} boots the installed OS and joins")


# --- warm hosts (hosts/flows/warm.py): a claim on a host that waits, on, in the agent's ramdisk --------------------

def provision_begin(run: Run) -> None:
    """Nothing is written on the host yet: it passed its last gate (available, or under its idle check), and the
    run records its first disk write (hosts.engine.agent.DISK_WRITTEN; a claim's failure before it is not followed by
    an erase: hosts.flows.host.host_flow_fail).

    A host whose agent session is open and was heard from lately is warm: its provision has no power-on,
    network boot, lookup or inspection (those steps do not apply) and starts with the agent it has. A host
    whose agent is silent (it died while warm) is provisioned cold, as any other."""
    run.data[DISK_WRITTEN] = False
    session = warm_session(run.host.pk)
    if session is not None:
        run.data["warm"] = {"boot_id": session.boot_id, "agent_seen_at": session.last_seen_at.isoformat()}


def cold(run: Run) -> bool:
    return not run.data.get("warm")


def _warm_lost(run: Run, message: str) -> Waiting:
    """The warm host's agent stopped answering before anything was written: the provision goes on by the cold
    path on the same host (power-on into the ramdisk, lookup), its unanswered command queued afresh then."""
    run.data["warm"] = False
    run.data["warm_lost"] = message
    HostCommand.objects.filter(host=run.host, flow_id=run.flow["id"]).exclude(status=CommandStatus.DONE).delete()
    return step_retry(run, f"the warm host's agent is gone ({message}): provisioning it cold", recheck_s=0.1)


# --- the flows that serve a claim, on the step engine (hosts.engine) ----------------------------------------

PROVISION = host_flow("provision", HostState.PROVISIONING, [
    # A cold host gets the NodeType's BIOS settings on the way into the ramdisk (hosts/flows/firmware.py); a warm one
    # was verified at its intake and is not rebooted for them.
    *(dataclasses.replace(s, when=lambda run, s=s: cold(run) and s.applies(run))
      for s in (BIOS_APPLY, *RAMDISK_STEPS[:2], BIOS_VERIFY, INSPECT_UNLESS_KNOWN)),
    *HANDOVER_STEPS,  # the handover tier, before anything is written: a failure sends the host to repair and
    # gives the claim another host
    Step(CHECK_STEP, step_check_tenant_api, deadline_setting("AGENT_COMMAND_DEADLINE_S")),
    Step("write_image", step_write_image, deadline_setting("IMAGE_WRITE_DEADLINE_S")),
    Step("write_seed", step_write_seed, deadline_setting("AGENT_COMMAND_DEADLINE_S")),
    Step("reboot_to_disk", step_reboot_to_disk, deadline_setting("AGENT_COMMAND_DEADLINE_S")),
    Step("boot_from_disk", step_boot_from_disk, deadline_setting("POWER_STEP_DEADLINE_S")),
    Step("node_ready", step_node_ready, deadline_setting("NODE_READY_DEADLINE_S")),
    Step("node_labels", step_node_labels, deadline_setting("AGENT_COMMAND_DEADLINE_S")),
], done_state=HostState.PROVISIONED,
    clean_state=HostState.DEPROVISIONING,  # a failure that may leave half an image or a seed: cleaned, not parked
    after_step={"boot_from_disk": claim_joining}, related=("claim__tenant", "claim__node_type"),
    begin=provision_begin)

# The tenant's side of a release (drain, delete) is skipped with its reason when it fails: a tenant API that is
# away must not keep the host from being erased. A provision that failed by its claim's fault before anything was
# written (hosts.flows.steps.untouched_begin) skips the ramdisk boot and the release gate: no_erase_needed says so, and
# the host is powered off (or kept warm: it is on in the ramdisk, its agent live) and back in the pool.
DEPROVISION = host_flow("deprovision", HostState.DEPROVISIONING, [
    Step("drain_node", step_drain_node, deadline_setting("DRAIN_DEADLINE_S"), on_deadline=SKIP),
    Step("delete_node", step_delete_node, deadline_setting("DRAIN_DEADLINE_S"), on_deadline=SKIP),
    *unless_untouched([
        Step("power_off", step_power_off, deadline_setting("POWER_STEP_DEADLINE_S")),
        *RAMDISK_STEPS[:2],
        *CLEANING_STEPS,
    ]),
    NO_ERASE_NEEDED,
    KEEP_WARM,
    power_off_unless_warm("power_off_after_clean"),
], done_state=HostState.AVAILABLE, gate=True, related=("claim__tenant", "claim__node_type"), begin=untouched_begin)
