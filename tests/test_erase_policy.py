"""Erase policy per disk and per next owner: a release that may take the host to another tenant purges every disk
of the census, even one its pool marks kept; a re-image of the same pool keeps the data disks the pool marks kept
where the NodeType allows it, and always erases the OS disk; the certificate says the level, the method and why;
an agent that keeps or erases the wrong disk fails the gate; a host holding kept data is its pool's alone, and
when the hold ends it gets the full erase before anyone else has it; bad rules are refused at apply."""
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from claims.allocation import claims_allocate
from claims.choices import ClaimPhase, ReleasePurpose
from claims.kept import kept_holds_end
from claims.models import NodeClaim
from events.models import Event
from hosts.gate import certificates, cleaning
from hosts.gate.census import census_take
from hosts.gate.plan import REIMAGE, erase_plan
from hosts.models import BareMetalHost
from pools.models import NodePool, NodeType

from .factories import make_hosts, make_pool

pytestmark = pytest.mark.django_db

OS_DISK = {"name": "nvme0n1", "serial": "S-OS", "model": "SAMSUNG MZWLO3T8HCLS", "size_bytes": 960 * 2**30,
           "type": "nvme"}
DATA_DISK = {"name": "nvme1n1", "serial": "S-DATA", "model": "SAMSUNG MZWLO3T8HCLS", "size_bytes": 3840755982336,
             "type": "nvme"}
RULES = [{"role": "os", "method": "full"},
         {"role": "scratch", "match": {"minSize": "2Ti", "kind": "nvme"}, "method": "nvme-sanitize-crypto",
          "keepOnReimage": True}]


@pytest.fixture
def world(apply):
    apply(open("demo/site.yaml").read())
    NodeType.objects.filter(name="gpu-server").update(cleaning_disks=RULES)
    make_hosts(1)
    host = BareMetalHost.objects.get()
    host.inventory = {"disks": [OS_DISK, DATA_DISK], "system": {"serial": "SYS-1"}}
    host.save(update_fields=["inventory"])
    pool = make_pool("one", 1)
    pool.keep_disks = ["scratch"]
    pool.save(update_fields=["keep_disks"])
    return host, pool


def released_claim(pool, purpose):
    return NodeClaim(name="one-gpu-a1", tenant=pool.tenant, pool=pool, pool_name=pool.name,
                     provider=pool.provider, release_purpose=purpose)


def gate_of(host, claim):
    gate = cleaning.gate_for(host, claim)
    census = census_take(host=host, bmc_drives=None)
    gate["plan"] = erase_plan(host=host, claim=claim, node_type=NodeType.objects.get(name="gpu-server"),
                              census=census, policy=gate["policy"])
    return gate, census


def agent_erased(disk, **changes):
    record = {**disk, "ok": True, "method": "secure", "requested": "secure", "method_type": "Purge",
              "method_details": "NVMe Format NVM, Secure Erase Setting 2: cryptographic erase", "tool": "nvme-cli",
              "expectation": "changed", "attempts": [], "fallback_from": None}
    return {**record, **changes}


def agent_verified(disk, expectation="changed"):
    return {"name": disk["name"], "serial": disk["serial"], "size_bytes": disk["size_bytes"],
            "expectation": expectation, "mode": "sampled", "direct_io": True, "passed": True, "findings": [],
            "canaries": {"planted": 64, "checked": 64, "survived": 0},
            "samples": {"count": 100, "chunk": 65536, "share": 0.01, "dirty": 0, "unchanged": 0}}


def issue(host, gate, census, erased, verified, flow_id="f-1"):
    certs = cleaning.issue_certificates(host=host, flow_id=flow_id, gate=gate,
                                        previous={"tenant": "one", "claim": "one-gpu-a1"},
                                        erase={"disks": erased}, verify={"disks": verified, "passed": True},
                                        census=census)
    return {c.disk: c for c in certs}


def test_the_plan_and_the_claims_agree_on_what_a_reimage_is():
    assert REIMAGE == ReleasePurpose.REIMAGE


def test_a_release_to_another_tenant_purges_every_disk_even_the_one_its_pool_marks_kept(world):
    host, pool = world
    gate, census = gate_of(host, released_claim(pool, ReleasePurpose.FREE))
    plan = {d["disk"]: d for d in gate["plan"]["disks"]}
    assert gate["plan"]["next_owner"] == "another tenant"
    assert {d["action"] for d in plan.values()} == {"erase"} and {d["level"] for d in plan.values()} == {"Purge"}
    # The OS disk's own rule asks a Clear (full): not enough for another tenant; the drive's purge first.
    assert plan["nvme0n1"]["methods"] == ["secure", "full"]
    assert plan["nvme1n1"]["methods"] == ["nvme-sanitize-crypto", "secure", "full"]
    assert "pool one/gpu marks it kept, but this release is not a re-image" in plan["nvme1n1"]["why"]

    certs = issue(host, gate, census,
                  [agent_erased(OS_DISK), agent_erased(DATA_DISK, method="nvme-sanitize-crypto",
                                                       method_details="NVMe Sanitize, action 4: cryptographic erase")],
                  [agent_verified(OS_DISK), agent_verified(DATA_DISK)])
    assert {c.result for c in certs.values()} == {"pass"} and {c.method_type for c in certs.values()} == {"Purge"}
    policy = certs["nvme1n1"].document["disk_policy"]
    assert policy["level"] == "Purge" and policy["next_owner"] == "another tenant"
    assert policy["why"].startswith("Purge by NVMe sanitize crypto erase (NVMe Sanitize, action 4: cryptographic "
                                    "erase): the host may go to another tenant")


def test_a_disk_that_offers_no_purge_is_cleared_and_its_certificate_says_why(world):
    host, pool = world
    gate, census = gate_of(host, None)  # a registration's or a repair's erase: nobody's next
    reason = "secure: the controller does not offer crypto-format (fna=0x0, sanicap=0x0)"
    certs = issue(host, gate, census,
                  [agent_erased(OS_DISK, method="full", method_type="Clear", fallback_from="secure",
                                fallback_reason=reason, expectation="zeros"),
                   agent_erased(DATA_DISK)],
                  [agent_verified(OS_DISK, "zeros"), agent_verified(DATA_DISK)])
    assert certs["nvme0n1"].result == "pass" and certs["nvme0n1"].method_type == "Clear"
    assert certs["nvme0n1"].document["disk_policy"]["why"].endswith(f"only Clear was possible: {reason}")


def test_a_reimage_of_the_same_pool_keeps_the_marked_data_disk_and_erases_the_os_disk(world, client,
                                                                                      django_user_model):
    host, pool = world
    gate, census = gate_of(host, released_claim(pool, ReleasePurpose.REIMAGE))
    plan = {d["disk"]: d for d in gate["plan"]["disks"]}
    assert gate["plan"]["next_owner"] == "the same pool" and gate["plan"]["os_disk"] == "nvme0n1"
    assert (plan["nvme0n1"]["action"], plan["nvme0n1"]["methods"], plan["nvme0n1"]["level"]) == (
        "erase", ["full"], "Clear")
    assert plan["nvme1n1"]["action"] == "keep"

    certs = issue(host, gate, census,
                  [agent_erased(OS_DISK, method="full", requested="full", method_type="Clear", expectation="zeros"),
                   {**DATA_DISK, "ok": True, "kept": True, "method": "kept"}],
                  [agent_verified(OS_DISK, "zeros")])
    os_cert, data_cert = certs["nvme0n1"], certs["nvme1n1"]
    assert (os_cert.result, os_cert.method_type) == ("pass", "Clear")
    assert os_cert.document["disk_policy"]["why"].startswith("Clear by full overwrite")
    assert (data_cert.result, data_cert.method, data_cert.document["result"]) == ("pass", "kept", "kept")
    assert data_cert.document["disk_policy"]["why"] == (
        "kept: data disk (scratch) marked kept by pool one/gpu for a re-image of the same pool")
    assert data_cert.document["post_sanitization_classification"].startswith("tenant data remains")
    # The certificate page shows it, and the file still verifies.
    django_user_model.objects.create_superuser("admin", password="pw")
    client.force_login(django_user_model.objects.get(username="admin"))
    page = client.get(f"/certificates/{data_cert.pk}/").content.decode()
    assert "marked kept by pool one/gpu" in page
    download = client.get(f"/certificates/{data_cert.pk}.json")
    assert certificates.verify_text(b"".join(download).decode() if download.streaming else
                                    download.content.decode())[0]


def test_a_pool_cannot_keep_a_disk_its_node_type_does_not_allow_nor_the_os_disk(world):
    host, pool = world
    NodeType.objects.filter(name="gpu-server").update(cleaning_disks=[
        {"role": "scratch", "match": {"kind": "nvme", "minSize": "2Ti"}, "method": "full"}])
    pool.keep_disks = ["scratch", "os"]  # as a row written behind apply's back
    pool.save(update_fields=["keep_disks"])
    gate, _ = gate_of(host, released_claim(pool, ReleasePurpose.REIMAGE))
    plan = {d["disk"]: d for d in gate["plan"]["disks"]}
    assert {d["action"] for d in plan.values()} == {"erase"}
    assert "NodeType gpu-server does not allow keeping it" in plan["nvme1n1"]["why"]
    assert "the OS disk is always erased" in plan["nvme0n1"]["why"]


@pytest.mark.parametrize("lie", ["keeps the os disk", "keeps a disk another tenant gets", "wipes metadata only",
                                 "clears where it must purge, without a reason"])
def test_an_agent_that_keeps_or_erases_the_wrong_disk_fails_the_gate(world, lie):
    host, pool = world
    purpose = ReleasePurpose.REIMAGE if lie == "keeps the os disk" else ReleasePurpose.FREE
    gate, census = gate_of(host, released_claim(pool, purpose))
    kept = {"ok": True, "kept": True, "method": "kept"}
    erased = {"keeps the os disk": [{**OS_DISK, **kept}, agent_erased(DATA_DISK)],
              "keeps a disk another tenant gets": [agent_erased(OS_DISK), {**DATA_DISK, **kept}],
              "wipes metadata only": [agent_erased(OS_DISK, method="metadata", method_type="None",
                                                   expectation="zeros"), agent_erased(DATA_DISK)],
              "clears where it must purge, without a reason": [agent_erased(OS_DISK),
                                                agent_erased(DATA_DISK, method="full", method_type="Clear")]}[lie]
    verified = [agent_verified(d) for d in erased if not d.get("kept")]
    certs = issue(host, gate, census, erased, verified)
    failed = [c for c in certs.values() if c.result == "fail"]
    assert len(failed) == 1, {c.disk: c.document["verification"]["findings"] for c in certs.values()}
    findings = " ".join(failed[0].document["verification"]["findings"])
    assert {"keeps the os disk": "the agent kept this disk; the plan erases it",
            "keeps a disk another tenant gets": "the agent kept this disk; the plan erases it",
            "wipes metadata only": "erased by metadata, which the plan does not name",
            "clears where it must purge, without a reason": "a Clear erase where the plan asks Purge, with no reason "
                                                            "from the disk"}[lie] in findings


# --- the hold: a host with kept data is its pool's alone ---------------------------------------------------------

def hold(host, pool, *, until=None):
    BareMetalHost.objects.filter(pk=host.pk).update(
        kept_for_pool=pool, kept_until=until or timezone.now() + timedelta(hours=1),
        kept_disks=[{"disk": "nvme1n1", "serial": "S-DATA", "role": "scratch"}])


def test_another_tenants_claim_never_gets_the_host_held_for_a_pool_but_the_pool_s_own_claim_does(world):
    host, pool = world
    hold(host, pool)
    other = make_pool("two", 1)
    call_command("reconcile")  # pool two's claim (and pool one's) are created; only the held host is free
    theirs = NodeClaim.objects.get(pool=other)
    ours = NodeClaim.objects.get(pool=pool)
    assert ours.host_id == host.pk
    assert theirs.phase == ClaimPhase.PENDING and theirs.host_id is None and theirs.reason == "NoCapacity"
    host.refresh_from_db()
    assert (host.state, host.kept_until, host.kept_for_pool) == ("provisioning", None, None)


def test_another_tenants_pending_claim_waits_while_the_only_free_host_is_held(world):
    host, pool = world
    hold(host, pool)
    pool.quantity = 0
    pool.save(update_fields=["quantity"])
    other = make_pool("two", 1)
    call_command("reconcile")
    claims_allocate(pool_ids=[other.pk])
    theirs = NodeClaim.objects.get(pool=other)
    assert theirs.phase == ClaimPhase.PENDING and theirs.host_id is None
    host.refresh_from_db()
    assert host.state == "available" and host.kept_for_pool_id == pool.pk


@pytest.mark.parametrize("how", ["timeout", "pool deleted", "scaled down", "tenant deleted", "admin"])
def test_a_hold_that_ends_sends_the_host_to_the_full_erase_before_anyone_else_has_it(world, how):
    host, pool = world
    hold(host, pool, until=timezone.now() - timedelta(seconds=1) if how == "timeout" else None)
    make_pool("two", 1)
    if how == "pool deleted":
        NodePool.objects.filter(pk=pool.pk).delete()
    elif how == "scaled down":
        NodeClaim.objects.create(name="one-gpu-b2", tenant=pool.tenant, pool=pool, pool_name=pool.name,
                                 provider=pool.provider, phase=ClaimPhase.PROVISIONING)
    elif how == "tenant deleted":
        pool.tenant.deleting_since = timezone.now()
        pool.tenant.save(update_fields=["deleting_since"])
    if how == "admin":
        assert kept_holds_end() == []  # the pool still wants it: the hold stands
        end_hold_from_the_host_page(host, "the tenant asked")
    else:
        assert kept_holds_end() == [host.name]
    host.refresh_from_db()
    assert host.state == "deprovisioning"
    moved = Event.objects.filter(host=host, to_state="deprovisioning").latest("id")
    assert "the hold on its kept data disks ended" in moved.message
    # The erase it gets is the one for another tenant: no claim, every disk purged.
    gate, _ = gate_of(host, None)
    assert gate["plan"]["next_owner"] == "another tenant"
    assert {d["level"] for d in gate["plan"]["disks"]} == {"Purge"}


def test_a_hold_that_still_stands_is_left_alone(world):
    host, pool = world
    hold(host, pool)
    NodeClaim.objects.create(name="one-gpu-b2", tenant=pool.tenant, pool=pool, pool_name=pool.name,
                             provider=pool.provider, phase=ClaimPhase.PENDING)
    assert kept_holds_end() == []
    host.refresh_from_db()
    assert host.state == "available" and host.kept_for_pool_id == pool.pk


# --- manifests ---------------------------------------------------------------------------------------------------

NODE_TYPE = """\
apiVersion: management.loft.sh/v1
kind: NodeType
metadata: {{name: gpu-kept}}
spec:
  providerRef: metal3
  properties: {{vcluster.com/node-type: gpu-kept}}
  cleaning:
    policy: full
    disks:
      - role: os
        method: metadata
      - role: scratch
        match: {{kind: nvme, minSize: 2Ti}}
        method: {method}
        keepOnReimage: true
"""

POOL = """\
privateNodes:
  autoNodes:
    - provider: metal3
      static:
        - name: gpu
          quantity: 0
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-kept
          cleaning:
            keepOnReimage: [{keep}]
"""


def test_disk_rules_and_kept_disks_apply_and_export(apply):
    apply(open("demo/site.yaml").read())
    apply(NODE_TYPE.format(method="nvme-sanitize-crypto"))
    make_pool("one", 0, node_type="gpu-kept")
    apply(POOL.format(keep="scratch"), tenant="one")
    assert NodePool.objects.get(tenant__name="one").keep_disks == ["scratch"]
    assert NodeType.objects.get(name="gpu-kept").cleaning_disks[1]["method"] == "nvme-sanitize-crypto"
    out = apply(POOL.format(keep="scratch"), tenant="one")
    assert "nodepool/one/gpu unchanged" in "\n".join(out)
    exported = call_command_output("export")
    assert "keepOnReimage:\n" in exported and "nvme-sanitize-crypto" in exported


def call_command_output(*args) -> str:
    import io
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("what, text, tenant, expect, line", [
    ("an unknown method", NODE_TYPE.format(method="shred"), None,
     "spec.cleaning.disks[1].method: 'shred' is not one of metadata, full", 14),
    ("keeping the os disk", POOL.format(keep="os"), "one",
     "cleaning.keepOnReimage: the OS disk is always erased", 11),
    ("a role the NodeType does not let a pool keep", POOL.format(keep="cache"), "one",
     "cleaning.keepOnReimage[0]: no NodeType of this pool (gpu-kept) lets a pool keep disk role 'cache'", 11),
])
def test_a_bad_erase_choice_is_refused_at_apply_with_its_line_and_nothing_changes(apply, what, text, tenant, expect,
                                                                                  line):
    apply(open("demo/site.yaml").read())
    apply(NODE_TYPE.format(method="full"))
    make_pool("one", 0, node_type="gpu-kept")
    before = (list(NodeType.objects.values_list("name", "cleaning_disks")),
              list(NodePool.objects.values_list("name", "keep_disks")))
    with pytest.raises(CommandError) as refused:
        apply(text, tenant=tenant)
    message = str(refused.value)
    assert expect in message and f"(line {line})" in message, message
    assert before == (list(NodeType.objects.values_list("name", "cleaning_disks")),
                      list(NodePool.objects.values_list("name", "keep_disks")))


def end_hold_from_the_host_page(host, reason: str) -> None:
    from django.contrib.auth.models import User

    from .test_console_host_actions import browser, confirm, text

    admin = User.objects.create_superuser("hold-admin", password="x")
    page = text(browser(admin).get(f"/hosts/{host.name}/"))
    assert "kept for pool one/gpu" in page and "End the hold" in page
    refused = confirm(browser(admin), host.name, "end-hold", {"reason": ""})
    assert "needs a reason" in text(refused) and BareMetalHost.objects.get(pk=host.pk).state == "available"
    done = confirm(browser(admin), host.name, "end-hold", {"reason": reason})
    assert "every disk of" in text(done)
    assert Event.objects.filter(host=host, to_state="deprovisioning", message__contains=reason).exists()


def test_who_sees_a_hold_and_who_may_end_it(world, client):
    from django.contrib.auth.models import Group, User

    host, pool = world
    hold(host, pool)
    admin = User.objects.create_superuser("hold-admin", password="x")
    client.force_login(admin)
    kept = client.get(f"/api/v1/hosts/{host.pk}/").json()["kept"]
    assert kept["pool"] == "one/gpu" and kept["disks"] == [{"disk": "nvme1n1", "serial": "S-DATA", "role": "scratch"}]
    operator = User.objects.create_user("olly", password="x")
    operator.groups.add(Group.objects.get_or_create(name="operators")[0])
    client.force_login(operator)
    assert "End the hold" not in client.get(f"/hosts/{host.name}/").content.decode()
    assert client.post(f"/hosts/{host.name}/actions/end-hold/", {"reason": "mine now"}).status_code == 403
    host.refresh_from_db()
    assert host.state == "available" and host.kept_until is not None  # nothing changed
