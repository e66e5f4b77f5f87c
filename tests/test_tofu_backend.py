"""OpenTofu's HTTP state backend, asked over real HTTP as OpenTofu asks it (GET, POST ?ID=, LOCK, UNLOCK with the
LockInfo JSON, basic auth), and the admin API that lists states and releases a stuck lock."""
import json
import uuid

import pytest
import requests
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client

from events.models import Event
from machines.models import TofuState
from machines.tofu.backend import tofu_credentials

WORKSPACE = "one-abc12.default.node"


def lock_info(**changes) -> dict:
    return {"ID": str(uuid.uuid4()), "Operation": "OperationTypeApply", "Info": "", "Who": "runner@worker-1",
            "Version": "1.8.0", "Created": "2026-12-05T17:00:00Z", "Path": "", **changes}


def state(serial: int, lineage: str = "lineage-1", **outputs) -> str:
    return json.dumps({"version": 4, "serial": serial, "lineage": lineage,
                       "outputs": {k: {"value": v, "type": "string"} for k, v in outputs.items()}, "resources": []})


class Tofu:
    """What OpenTofu's http backend client sends, to one workspace, with its credentials."""

    def __init__(self, base: str, name: str, password: str):
        self.url, self.auth = f"{base}/api/v1/tofu/state/{name}", (name, password)

    def get(self):
        return requests.get(self.url, auth=self.auth, timeout=10)

    def post(self, body: str, lock_id: str | None = None):
        return requests.post(self.url, params={"ID": lock_id} if lock_id else None, data=body, auth=self.auth,
                             headers={"Content-Type": "application/json"}, timeout=10)

    def lock(self, info: dict):
        return requests.request("LOCK", self.url, data=json.dumps(info), auth=self.auth, timeout=10)

    def unlock(self, info: dict | None):
        return requests.request("UNLOCK", self.url, data=json.dumps(info) if info else b"", auth=self.auth,
                                timeout=10)


@pytest.fixture
def tofu(live_server, transactional_db) -> Tofu:
    return Tofu(live_server.url, WORKSPACE, tofu_credentials(name=WORKSPACE))


def test_a_new_workspace_has_no_state_and_answers_204(tofu):
    response = tofu.get()
    assert response.status_code == 204 and response.content == b""


def test_a_locked_write_is_read_back_exactly(tofu):
    info = lock_info()
    assert tofu.lock(info).status_code == 200
    assert tofu.post(state(1, node="n1"), info["ID"]).status_code == 200
    assert tofu.unlock(info).status_code == 200
    response = tofu.get()
    assert response.status_code == 200 and response.text == state(1, node="n1")
    assert response.headers["Content-MD5"]
    assert TofuState.objects.get(name=WORKSPACE).serial == 1


def test_a_second_lock_is_refused_with_the_holders_lock_info(tofu):
    first, second = lock_info(), lock_info(Who="someone-else")
    assert tofu.lock(first).status_code == 200
    response = tofu.lock(second)
    assert response.status_code == 409
    assert response.json()["ID"] == first["ID"] and response.json()["Who"] == "runner@worker-1"
    assert TofuState.objects.get(name=WORKSPACE).lock_id == first["ID"]


def test_a_write_without_or_with_another_lock_id_while_locked_is_refused_and_changes_nothing(tofu):
    info = lock_info()
    tofu.lock(info)
    tofu.post(state(1, node="kept"), info["ID"])
    assert tofu.post(state(2, node="intruder")).status_code == 409
    assert tofu.post(state(2, node="intruder"), str(uuid.uuid4())).status_code == 409
    assert tofu.get().text == state(1, node="kept")


def test_a_write_with_an_id_after_the_lock_was_released_is_refused(tofu):
    """An admin released the lock under a running apply: that apply's late write must not land."""
    info = lock_info()
    tofu.lock(info)
    tofu.unlock(info)
    assert tofu.post(state(1), info["ID"]).status_code == 409
    assert tofu.get().status_code == 204


def test_an_older_serial_of_the_same_lineage_is_refused(tofu):
    assert tofu.post(state(3)).status_code == 200
    assert tofu.post(state(2)).status_code == 409
    assert json.loads(tofu.get().text)["serial"] == 3


def test_unlock_needs_the_holders_id_and_force_unlock_is_refused(tofu):
    info = lock_info()
    tofu.lock(info)
    assert tofu.unlock(lock_info()).status_code == 409
    assert tofu.unlock(None).status_code == 409  # `tofu force-unlock` sends no LockInfo: an admin's job here
    assert TofuState.objects.get(name=WORKSPACE).lock_id == info["ID"]
    assert tofu.unlock(info).status_code == 200
    assert TofuState.objects.get(name=WORKSPACE).lock_id == ""


def test_a_wrong_password_is_401_and_changes_nothing(tofu, live_server):
    tofu.post(state(1, node="kept"))
    wrong = Tofu(live_server.url, WORKSPACE, "not-the-password")
    for response in (wrong.get(), wrong.post(state(2)), wrong.lock(lock_info()), wrong.unlock(lock_info())):
        assert response.status_code == 401 and response.headers["WWW-Authenticate"].startswith("Basic")
    kept = TofuState.objects.get(name=WORKSPACE)
    assert kept.lock_id == "" and kept.serial == 1
    assert requests.get(tofu.url, timeout=10).status_code == 401  # no credentials at all


def test_another_workspaces_password_does_not_open_this_one(tofu, live_server):
    tofu.post(state(1, node="mine"))
    other_password = tofu_credentials(name="two-def34.default.node")
    # Its own name and password, this workspace's URL; this workspace's name with the other's password.
    borrowed = requests.get(tofu.url, auth=("two-def34.default.node", other_password), timeout=10)
    guessed = requests.get(tofu.url, auth=(WORKSPACE, other_password), timeout=10)
    assert borrowed.status_code == guessed.status_code == 401
    assert "mine" not in borrowed.text + guessed.text


def test_a_new_password_for_the_next_run_retires_the_last(tofu, live_server):
    tofu_credentials(name=WORKSPACE)
    assert tofu.get().status_code == 401


def test_the_state_is_encrypted_in_its_row(tofu):
    tofu.post(state(1, node="plaintext-marker-7"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT tofu_state, password_hash FROM machines_tofustate WHERE name = %s", [WORKSPACE])
        raw, password_hash = cursor.fetchone()
    assert raw and "plaintext-marker-7" not in raw and "lineage" not in raw
    assert tofu.auth[1] not in password_hash


def test_delete_empties_the_state_but_not_while_locked(tofu):
    tofu.post(state(1))
    info = lock_info()
    tofu.lock(info)
    assert requests.delete(tofu.url, auth=tofu.auth, timeout=10).status_code == 409
    tofu.unlock(info)
    assert requests.delete(tofu.url, auth=tofu.auth, timeout=10).status_code == 200
    assert tofu.get().status_code == 204


# -- the admin API ---------------------------------------------------------------------------------

@pytest.fixture
def people(db):
    admin = User.objects.create_user("ada", password="pw-ada-123", is_staff=True)
    auditor = User.objects.create_user("aud", password="pw-aud-123")
    auditor.groups.add(Group.objects.get_or_create(name="auditors")[0])
    member = User.objects.create_user("mel", password="pw-mel-123")
    clients = {}
    for user in (admin, auditor, member):
        clients[user.username] = Client()
        clients[user.username].force_login(user)
    return clients


def stuck(name: str = WORKSPACE) -> dict:
    info = lock_info(Who="runner@worker-crashed")
    tofu_credentials(name=name)
    TofuState.objects.filter(name=name).update(tofu_state=state(4, node="secret-state"), serial=4, lock_id=info["ID"],
                                               lock_info=info)
    return info


def test_staff_list_states_with_their_locks_and_never_their_content(people):
    info = stuck()
    for who in ("ada", "aud"):
        rows = people[who].get("/api/v1/tofu-states/").json()["results"]
        assert [(r["name"], r["locked"], r["lock_id"], r["has_state"]) for r in rows] == \
            [(WORKSPACE, True, info["ID"], True)]
        assert rows[0]["lock_info"]["Who"] == "runner@worker-crashed"
        assert "secret-state" not in json.dumps(rows) and "password" not in json.dumps(rows)


def test_a_member_sees_no_states_and_releases_no_lock(people):
    info = stuck()
    assert people["mel"].get("/api/v1/tofu-states/").status_code == 403
    assert people["mel"].post(f"/api/v1/tofu-states/{WORKSPACE}/release-lock/").status_code == 403
    assert people["aud"].post(f"/api/v1/tofu-states/{WORKSPACE}/release-lock/").status_code == 403
    assert TofuState.objects.get(name=WORKSPACE).lock_id == info["ID"]
    assert not Event.objects.filter(step="tofu-lock-released").exists()


def test_an_admin_releases_a_stuck_lock_and_the_event_says_who_and_what(people):
    info = stuck()
    response = people["ada"].post(f"/api/v1/tofu-states/{WORKSPACE}/release-lock/")
    assert response.status_code == 200 and response.json()["locked"] is False
    assert TofuState.objects.get(name=WORKSPACE).lock_id == ""
    event = Event.objects.get(step="tofu-lock-released")
    assert event.actor.endswith("ada") and info["ID"] in event.message and "runner@worker-crashed" in event.message
    assert event.data["lock"]["ID"] == info["ID"] and event.data["workspace"] == WORKSPACE
    again = people["ada"].post(f"/api/v1/tofu-states/{WORKSPACE}/release-lock/")
    assert again.status_code == 409
