"""Kind `terraform` end to end against a stand-in `tofu` (tests/fixtures/fake_tofu) that speaks to the console's
state backend over real HTTP as OpenTofu does: fill, power and release; templates from git; failures, timeouts
and the stuck lock a crashed run leaves; secrets kept out of argv, messages and logs."""
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from claims.models import NodeClaim
from events.models import Event
from machines.choices import DiskProof, MachineState
from machines.kinds import Join, KindError, kind_of
from machines.kinds.terraform import workspace_name
from machines.models import Machine, ProviderSecret, TofuState
from pools.models import NodeProvider, NodeType, Tenant

FAKE = Path(__file__).resolve().parent / "fixtures" / "fake_tofu"
USER_DATA = "#cloud-config\nruncmd:\n- vcluster node join --token abcdef.0123456789abcdef-user-data-secret\n"
TEMPLATE = """
variable "vcluster" { type = any }
output "node" { value = var.vcluster.name }
output "power" { value = var.vcluster.powerState }
output "zone" { value = "zone-a" }
"""


@pytest.fixture
def tofu_log(tmp_path, settings, live_server, transactional_db) -> Path:
    """TOFU_BINARY: the stand-in, through a wrapper that tells it where to write what it was given."""
    log = tmp_path / "calls.jsonl"
    wrapper = tmp_path / "tofu"
    wrapper.write_text(f"#!/bin/sh\nFAKE_TOFU_LOG={log} exec {sys.executable} {FAKE} \"$@\"\n")
    wrapper.chmod(0o755)
    settings.TOFU_BINARY = str(wrapper)
    settings.TOFU_WORKDIR = tmp_path / "work"
    settings.TOFU_STATE_URL = f"{live_server.url}/api/v1/tofu/state"
    return log


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def make_machine(template, *, node_config: dict | None = None, provider_config: dict | None = None) -> Machine:
    tenant = Tenant.objects.create(name="acme")
    provider = NodeProvider.objects.create(name="cloud", kind="terraform",
                                           config={"nodeTemplate": template, **(provider_config or {})})
    node_type = NodeType.objects.create(name="cloud-small", provider=provider, properties={"instance-type": "small"},
                                        provider_config=node_config or {})
    claim = NodeClaim.objects.create(name="one-abc12", namespace="p-default", tenant=tenant, provider=provider,
                                     node_type=node_type, pool_name="cloud")
    return Machine.objects.create(claim=claim, provider=provider, node_type=node_type, kind="terraform")


def fill(machine: Machine) -> None:
    kind_of(machine.provider).fill(machine, Join(user_data=USER_DATA, node_name="one-abc12", token_id="abcdef"))
    machine.save()


def stored_state(machine) -> dict:
    return json.loads(str(TofuState.objects.get(name=workspace_name(machine.claim)).tofu_state))


def test_the_workspace_is_named_after_the_claim_and_its_project(db):
    claim = NodeClaim(name="one-abc12", namespace="p-research")
    assert workspace_name(claim) == "one-abc12.research.node"


def test_fill_applies_the_template_and_keeps_its_outputs(tofu_log):
    machine = make_machine({"inline": TEMPLATE})
    fill(machine)
    kind = kind_of(machine.provider)
    assert machine.outputs == {"node": "one-abc12", "power": "On", "zone": "zone-a"}
    assert machine.made == [{"kind": "Workspace", "name": "one-abc12.default.node"}]
    assert kind.progress(machine).state == MachineState.RUNNING
    assert [c["argv"][1:] for c in calls(tofu_log)] == [
        ["init", "-input=false", "-reconfigure", "-no-color"],
        ["apply", "-auto-approve", "-input=false", "-no-color"],
        ["output", "-json", "-no-color"]]
    inputs = stored_state(machine)["resources"][0]["instances"][0]["attributes"]["inputs"]
    assert inputs["name"] == "one-abc12" and inputs["namespace"] == "p-default"
    assert inputs["nodeType"]["spec"]["properties"] == {"instance-type": "small"}
    assert inputs["nodeClaim"]["metadata"]["name"] == "one-abc12"
    assert inputs["instance"]["metadata"]["name"] == "acme" and inputs["nodeEnvironment"]["outputs"] == {}
    state = TofuState.objects.get(name="one-abc12.default.node")
    assert state.serial == 1 and state.lock_id == "" and state.provider == machine.provider
    # userData was a 0600 file for the run only.
    workspace = Path(calls(tofu_log)[0]["cwd"])
    assert not list(workspace.glob("*.tfvars.json"))


def test_a_sensitive_output_is_named_but_not_kept(tofu_log):
    machine = make_machine({"inline": TEMPLATE + 'output "admin_password" {\n  value = "hunter2-output"\n'
                                                 '  sensitive = true\n}\n'})
    fill(machine)
    assert machine.outputs["admin_password"] == "(sensitive)" and machine.outputs["zone"] == "zone-a"


def test_fill_again_does_not_apply_again(tofu_log):
    machine = make_machine({"inline": TEMPLATE})
    fill(machine)
    fill(machine)
    assert len(calls(tofu_log)) == 3


def test_power_off_on_and_reboot_apply_the_power_state(tofu_log):
    machine = make_machine({"inline": TEMPLATE})
    fill(machine)
    kind = kind_of(machine.provider)
    kind.power(machine, "off")
    assert machine.power == "Off" and machine.outputs["power"] == "Off"
    assert kind.progress(machine).state == MachineState.STOPPED
    kind.power(machine, "reboot")
    assert machine.power == "On" and machine.outputs["power"] == "On"
    applied = [c for c in calls(tofu_log) if c["argv"][1] == "apply"]
    assert len(applied) == 4  # fill, off, reboot's off and on
    state = stored_state(machine)
    assert state["serial"] == 4
    # The join's userData of the fill is applied again (sealed), not an empty one that would replace the machine.
    import hashlib
    assert state["resources"][0]["instances"][0]["attributes"]["inputs"]["userData_sha256"] == \
        hashlib.sha256(USER_DATA.encode()).hexdigest()


def test_release_destroys_and_forgets_the_state(tofu_log):
    machine = make_machine({"inline": TEMPLATE})
    fill(machine)
    kind = kind_of(machine.provider)
    workspace = Path(calls(tofu_log)[0]["cwd"])
    assert kind.release(machine) is True
    assert calls(tofu_log)[-1]["argv"][1] == "destroy"
    assert not TofuState.objects.filter(name="one-abc12.default.node").exists()
    assert not workspace.exists() and machine.outputs == {}
    assert kind.disk_proof(machine) == DiskProof.DESTROYED
    assert kind.release(machine) is True  # nothing left: nothing run
    assert calls(tofu_log)[-1]["argv"][1] == "destroy" and len(calls(tofu_log)) == 5


def test_capacity_is_the_node_types_max_capacity_else_the_providers(db):
    machine = make_machine({"inline": TEMPLATE}, provider_config={"maxCapacity": 7})
    kind = kind_of(machine.provider)
    assert kind.capacity(machine.node_type) == 7
    machine.node_type.provider_config = {"maxCapacity": 2}
    assert kind.capacity(machine.node_type) == 2
    machine.provider.config = {"nodeTemplate": {"inline": TEMPLATE}}
    machine.node_type.provider_config = {}
    assert kind.capacity(machine.node_type) is None


def test_a_node_types_own_template_wins(tofu_log):
    machine = make_machine({"inline": TEMPLATE},
                           node_config={"nodeTemplate": {"inline": 'output "zone" { value = "zone-b" }'}})
    fill(machine)
    assert machine.outputs == {"zone": "zone-b"}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def commit_template(repo: Path, zone: str, message: str) -> str:
    (repo / "nodes").mkdir(parents=True, exist_ok=True)
    (repo / "nodes" / "main.tf").write_text(f'output "zone" {{ value = "{zone}" }}\n')
    (repo / "README.md").write_text("not the template\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "templates"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit_template(repo, "git-v1", "v1")
    git(repo, "tag", "v1")
    return repo


def test_a_template_from_git_at_a_tag_and_sub_path(tofu_log, repo):
    commit_template(repo, "git-v2", "v2 on main")
    machine = make_machine({"git": {"repository": f"file://{repo}", "tag": "v1", "subPath": "nodes"}})
    fill(machine)
    assert machine.outputs == {"zone": "git-v1"}
    assert not (Path(calls(tofu_log)[0]["cwd"]) / "README.md").exists()  # only subPath


def test_a_branch_is_fetched_again_only_after_the_fetch_interval(tofu_log, repo, settings):
    git_block = {"repository": f"file://{repo}", "branch": "main", "subPath": "nodes", "fetchInterval": "1h"}
    machine = make_machine({"git": git_block})
    fill(machine)
    assert machine.outputs == {"zone": "git-v1"}
    commit_template(repo, "git-v2", "v2")
    kind = kind_of(machine.provider)
    kind.power(machine, "on")
    assert machine.outputs == {"zone": "git-v1"}  # within the interval: the cached commit
    machine.provider.config = {"nodeTemplate": {"git": {**git_block, "fetchInterval": "0s"}}}
    kind.power(machine, "on")
    assert machine.outputs == {"zone": "git-v2"}


def test_a_commit_that_is_not_there_is_a_kind_error_that_waiting_does_not_fix(tofu_log, repo):
    machine = make_machine({"git": {"repository": f"file://{repo}", "commit": "0" * 40}})
    with pytest.raises(KindError) as failed:
        fill(machine)
    assert "no " + "0" * 40 in failed.value.message and failed.value.retry is False


def test_a_failed_apply_is_a_kind_error_with_the_tail_of_stderr(tofu_log):
    machine = make_machine({"inline": TEMPLATE + "# fake-tofu: fail\n"})
    with pytest.raises(KindError) as failed:
        fill(machine)
    assert "tofu apply failed (exit 1)" in failed.value.message
    assert "the stand-in was told to fail" in failed.value.message
    assert kind_of(machine.provider).progress(machine).state == MachineState.CREATING
    assert TofuState.objects.get(name="one-abc12.default.node").lock_id == ""


def test_a_missing_binary_is_named(tofu_log, settings):
    settings.TOFU_BINARY = "/nonexistent/tofu"
    machine = make_machine({"inline": TEMPLATE})
    with pytest.raises(KindError) as failed:
        fill(machine)
    assert "cannot run /nonexistent/tofu" in failed.value.message and failed.value.retry is False


def test_a_run_past_its_timeout_is_killed(tofu_log):
    machine = make_machine({"inline": TEMPLATE + "# fake-tofu: hang\n"}, provider_config={"timeout": "3s"})
    with pytest.raises(KindError) as failed:
        fill(machine)
    assert "tofu apply killed: the run did not finish within 3 s" in failed.value.message


def test_a_crashed_run_leaves_a_stuck_lock_that_an_admin_sees_and_releases(tofu_log):
    machine = make_machine({"inline": TEMPLATE + "# fake-tofu: crash-holding-lock\n"})
    with pytest.raises(KindError):
        fill(machine)
    admin = Client()
    admin.force_login(User.objects.create_user("ada", password="pw-ada-123", is_staff=True))
    [row] = admin.get("/api/v1/tofu-states/").json()["results"]
    assert row["name"] == "one-abc12.default.node" and row["locked"] is True
    assert row["lock_info"]["Who"].startswith("fake@")
    # The next run waits on the lock: OpenTofu's "Error acquiring the state lock", with the holder.
    machine.provider.config = {"nodeTemplate": {"inline": TEMPLATE}}
    with pytest.raises(KindError) as failed:
        fill(machine)
    assert "Error acquiring the state lock" in failed.value.message and row["lock_id"] in failed.value.message
    assert admin.post("/api/v1/tofu-states/one-abc12.default.node/release-lock/").status_code == 200
    event = Event.objects.get(step="tofu-lock-released")
    assert event.claim == machine.claim and row["lock_id"] in event.message
    fill(machine)
    assert machine.outputs["zone"] == "zone-a"


def test_secrets_stay_out_of_argv_messages_and_logs(tofu_log, caplog):
    ProviderSecret.objects.create(name="cloud-creds", labels={"terraform.vcluster.com/provider": "cloud"},
                                  contents=json.dumps({"CLOUD_API_KEY": "provider-key-s3cr3t-value"}))
    ProviderSecret.objects.create(name="other-creds", labels={"terraform.vcluster.com/provider": "elsewhere"},
                                  contents=json.dumps({"OTHER_KEY": "not-for-this-provider"}))
    machine = make_machine({"inline": TEMPLATE + "# fake-tofu: fail-leaking\n"})
    caplog.set_level(logging.DEBUG)
    with pytest.raises(KindError) as failed:
        fill(machine)
    assert "leaking ********" in failed.value.message
    seen = calls(tofu_log)
    assert "CLOUD_API_KEY" in seen[-1]["env"] and "OTHER_KEY" not in seen[-1]["env"]
    assert {"TF_HTTP_USERNAME", "TF_HTTP_PASSWORD"} <= set(seen[-1]["env"])
    assert not {"DATABASE_URL", "FIELD_ENCRYPTION_KEY", "SECRET_KEY"} & set(seen[-1]["env"])
    text = failed.value.message + json.dumps(seen) + caplog.text
    assert "user-data-secret" not in text and "provider-key-s3cr3t-value" not in text
    # The backend's password: no argument, no message, no log line carries anything like it.
    assert "TF_HTTP_PASSWORD=" not in text and not any("-password" in a for c in seen for a in c["argv"])
    backend_file = Path(seen[0]["cwd"]) / "zz_vmetal_backend_override.tf"
    assert "password" not in backend_file.read_text().split("credentials come from")[0]
