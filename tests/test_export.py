"""`manage.py export`: the same kinds back, a stable text, secrets redacted unless asked for."""
import io

import pytest
from django.core.management import call_command
from django.db import connection

from events.models import Event
from hosts.models import BareMetalHost
from pools.models import NodePool, Tenant

from .factories import GATED_PROVIDER, GATED_TYPE, LIST_FORM, empty_the_database, gate

pytestmark = pytest.mark.django_db

EXTRA = """\
apiVersion: management.loft.sh/v1
kind: NodeType
metadata:
  name: gpu-rack1
spec:
  providerRef: metal3
  displayName: GPU servers in rack 1
  cost: 5
  properties:
    vcluster.com/node-type: gpu-server
  bareMetalHosts:
    selector:
      matchLabels: {role: gpu, rack: r1}
  cleaning: {policy: secure, fallback: full, eraseVerifyShare: 0.02}
  healthCheck: {dcgmLevel: 3, ncclMinBusbwGBps: 400}
---
apiVersion: management.loft.sh/v1
kind: VirtualClusterInstance
metadata:
  name: three
  namespace: p-ml
  annotations:
    vmetal.dev/quota-nodes: "3"
    vmetal.dev/join-mode: kubeadm
spec:
  displayName: ML team
---
apiVersion: management.loft.sh/v1
kind: NodeEnvironment
metadata:
  name: ml-net
  namespace: p-ml
spec:
  providerRef: metal3
  vClusterRef: {name: three}
  properties:
    metal3.vcluster.com/network-cidr: 10.1.0.1/24
"""


def export(*args) -> str:
    out = io.StringIO()
    call_command("export", *args, stdout=out)
    return out.getvalue()


def test_export_then_apply_on_an_empty_database_then_export_gives_the_same_text(apply, demo_site, seed_block):
    apply(seed_block, tenant="one")
    apply(LIST_FORM, tenant="two")
    apply(EXTRA)
    call_command("reconcile")
    first = export()
    for kind in ("NodeProvider", "NodeType", "NodeEnvironment", "OSImage", "VirtualClusterInstance", "Secret",
                 "BareMetalHost"):
        assert f"kind: {kind}\n" in first
    assert "  cleaning:\n    policy: secure\n    fallback: full\n" in first
    empty_the_database()
    apply(first)
    assert export() == first
    assert NodePool.objects.count() == 4 and BareMetalHost.objects.count() == 8


def test_secrets_are_redacted_unless_asked_for(apply, demo_site):
    text = export()
    assert "demo-password" not in text and "ZGVtby1wYXNzd29yZC" not in text  # nor its base64
    assert "vmetal.dev/redacted: 'true'" in text
    with_secrets = export("--include-secrets")
    assert "ZGVtby1wYXNzd29yZC1ncHUtMDE=" in with_secrets  # base64 of demo-password-gpu-01


def test_a_redacted_export_applied_again_keeps_the_stored_credentials(apply, demo_site):
    apply(export())
    host = BareMetalHost.objects.get(name="gpu-01")
    assert host.bmc_password == "demo-password-gpu-01"


def test_bmc_passwords_are_encrypted_at_rest_and_never_in_repr(demo_site):
    host = BareMetalHost.objects.get(name="gpu-01")
    with connection.cursor() as cursor:
        cursor.execute("SELECT bmc_password, bmc_username FROM hosts_baremetalhost WHERE name = %s", ["gpu-01"])
        stored_password, stored_user = cursor.fetchone()
    assert "demo-password" not in stored_password and stored_password.startswith("gAAAA")  # a Fernet token
    assert stored_user != "admin"
    assert host.bmc_password == "demo-password-gpu-01"
    assert "demo-password" not in repr(host.bmc_password) and "demo-password" not in str(host)
    assert "demo-password" not in "".join(Event.objects.values_list("message", flat=True))


def test_the_release_gate_and_a_hosts_own_cleaning_method_survive_export_and_apply(apply, demo_site):
    apply(GATED_TYPE, GATED_PROVIDER)
    BareMetalHost.objects.filter(name="gpu-02").update(cleaning_policy="metadata")
    first = export()
    # Written even where they are the defaults, numbers as they would be typed.
    assert """\
  cleaning:
    policy: secure
    fallback: full
    eraseConcurrency: 8
    eraseVerifyShare: 0.05
    eraseVerifyFull: true
  healthCheck:
    dcgmLevel: 3
    ncclMinBusbwGBps: 400
""" in first
    assert """\
    - name: rack2-gpu
      cleaning:
        policy: metadata
        eraseConcurrency: 4
        eraseVerifyShare: 0.01
        eraseVerifyFull: false
      healthCheck:
        dcgmLevel: 0
        ncclMinBusbwGBps: 350.5
""" in first
    assert "  name: gpu-02\n  namespace: metal3\n  labels:\n    rack: r2\n    role: gpu\n  annotations:\n" \
           "    vmetal.dev/cleaning-policy: metadata\n" in first
    gates = {name: gate(name) for name in ("gpu-secure", "rack2-gpu", "gpu-server", "cpu-server")}
    empty_the_database()
    apply(first)
    assert export() == first
    assert {name: gate(name) for name in gates} == gates
    assert dict(BareMetalHost.objects.exclude(cleaning_policy="").values_list("name", "cleaning_policy")) == \
        {"gpu-02": "metadata"}
    assert all(line.endswith("unchanged") or "not referenced" in line for line in apply(first))


def test_a_tenants_kubeconfig_is_encrypted_at_rest_and_never_in_repr(apply, demo_site, seed_block):
    from pools.services import tenant_set_api

    apply(seed_block, tenant="one")
    kubeconfig = "apiVersion: v1\nusers:\n- name: one\n  user: {token: sekret-bearer-token-one}\n"
    tenant_set_api(tenant=Tenant.objects.get(name="one"), api_endpoint="127.0.0.1:6443", kubeconfig=kubeconfig,
                   actor="test")
    with connection.cursor() as cursor:
        cursor.execute("SELECT kubeconfig FROM pools_tenant WHERE name = %s", ["one"])
        (stored,) = cursor.fetchone()
    assert "sekret-bearer-token-one" not in stored and stored.startswith("gAAAA")
    tenant = Tenant.objects.get(name="one")
    assert tenant.kubeconfig == kubeconfig
    assert "sekret" not in repr(tenant) and "sekret" not in str(tenant)
    assert "sekret" not in "".join(Event.objects.values_list("message", flat=True))
