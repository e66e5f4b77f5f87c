"""Each cleaning method with its verification, on file-backed disks, through the agent's own commands: what
the erase leaves on the disk, what the read-back finds, O_DIRECT for every canary, NVMe's indeterminate
content, fallbacks that are recorded and never silent, planted faults caught. The drive commands are the
lab's fake `nvme` / `hdparm` (lab/fake_tools.py) acting on the disk files."""
import json
import math
import os
import random
import threading
import time
from pathlib import Path

import pytest

from agent import sanitize, verify
from agent.commands.base import Context
from agent.commands.registry import execute
from lab.fake_tools import install
from lab.hardware import LabHardware

MiB = 1024 * 1024
KEY = "5e" * 32


def make_disks(tmp_path: Path, *specs: dict, size: int = 32 * MiB) -> LabHardware:
    """Disk files full of "tenant data" (random), described by a lab profile with the fake tools."""
    tools = install(tmp_path / "tools")
    disks = []
    for i, spec in enumerate(specs):
        path = tmp_path / f"disk{i}.img"
        with open(path, "wb") as f:
            for _ in range(size // MiB):
                f.write(os.urandom(MiB))
        disks.append({"name": spec.get("name", f"nvme{i}n1"), "path": str(path), "type": "nvme",
                      "serial": f"S{i}", "model": "SAMSUNG MZWLO3T8HCLS", **spec})
    profile = tmp_path / "hardware.json"
    profile.write_text(json.dumps({"nics": [{"mac": "52:54:00:00:00:01"}], "disks": disks,
                                   "lab": {"tools": str(tools), "faults": []}}))
    return LabHardware.from_file(profile)


def erase_and_verify(hw, tmp_path, mode="sampled", **args):
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path))
    erased = execute("erase", {"erase_id": "e1", "key": KEY, **args}, ctx)
    assert erased.ok, erased.error
    checked = execute("verify_erase", {"erase_id": "e1", "key": KEY, "mode": mode}, ctx)
    assert checked.ok, checked.error
    return erased.result, checked.result


def read(path, offset=0, length=None) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length) if length else f.read()


def test_full_overwrites_every_byte_and_reads_canaries_and_a_one_percent_sample_back(tmp_path):
    hw = make_disks(tmp_path, {})
    erased, checked = erase_and_verify(hw, tmp_path, method="full")
    disk = erased["disks"][0]
    assert (disk["method"], disk["method_type"], disk["fallback_from"]) == ("full", "Clear", None)
    assert read(hw.disks()[0].path).count(0) == 32 * MiB  # every byte
    result = checked["disks"][0]
    assert result["passed"] and result["direct_io"] and result["expectation"] == "zeros"
    assert result["canaries"]["checked"] == result["canaries"]["planted"] == 64
    assert result["samples"]["count"] == math.ceil(32 * MiB * 0.01 / (64 * 1024))
    assert result["samples"]["count"] * 64 * 1024 >= 0.01 * 32 * MiB


def test_canaries_include_the_first_and_the_last_mib_and_are_keyed_per_erase():
    plan = verify.plan(b"k" * 32, 64 * MiB, "full")
    assert min(plan.canaries) < MiB and max(plan.canaries) >= 63 * MiB
    again = verify.plan(b"k" * 32, 64 * MiB, "full")
    other = verify.plan(b"j" * 32, 64 * MiB, "full")
    assert again.canaries == plan.canaries and again.samples == plan.samples  # a retry plants the same canaries
    assert other.canaries != plan.canaries and verify.canary_bytes(b"k" * 32, 0) != verify.canary_bytes(b"j" * 32, 0)


def test_metadata_zeroes_both_ends_leaves_the_middle_and_verifies_the_ends_whole(tmp_path):
    hw = make_disks(tmp_path, {})
    path = hw.disks()[0].path
    middle = read(path, 2 * MiB, 28 * MiB)
    erased, checked = erase_and_verify(hw, tmp_path, method="metadata")
    assert erased["disks"][0]["method_type"] == "None"  # not a sanitisation, and the certificate says so
    assert read(path, 0, 2 * MiB) == bytes(2 * MiB) and read(path, 30 * MiB, 2 * MiB) == bytes(2 * MiB)
    assert read(path, 2 * MiB, 28 * MiB) == middle
    result = checked["disks"][0]
    assert result["passed"] and result["samples"]["share"] == 1.0 and result["canaries"]["checked"] == 16
    assert result["regions"] == [[0, 2 * MiB], [30 * MiB, 2 * MiB]] or result["regions"] == [(0, 2 * MiB),
                                                                                             (30 * MiB, 2 * MiB)]


def test_nvme_secure_erase_leaves_indeterminate_content_and_is_not_judged_by_zeros(tmp_path):
    hw = make_disks(tmp_path, {})
    path = hw.disks()[0].path
    before = read(path)
    erased, checked = erase_and_verify(hw, tmp_path, method="secure")
    disk = erased["disks"][0]
    assert (disk["method"], disk["method_type"], disk["tool"]) == ("secure", "Purge", "nvme-cli")
    assert disk["commands"][-1].endswith("--ses=2 --force")  # the lab drive offers cryptographic erase
    after = read(path)
    assert after != before and after.count(0) < len(after) // 100  # neither the old data nor zeros
    result = checked["disks"][0]
    assert result["passed"] and result["expectation"] == "changed" and result["samples"]["unchanged"] == 0
    # Judged by zeros, the same healthy erase would "fail": that is why NVMe content is never judged so.
    state = json.loads((tmp_path / "vmetal-erase-e1.json").read_text())["disks"]["nvme0n1"]
    wrong = verify.verify(path, verify.disk_key(bytes.fromhex(KEY), "S0"),
                          verify.Prepared.from_dict(state["prepared"]), expectation=verify.ZEROS)
    assert wrong["samples"]["dirty"] == wrong["samples"]["count"]


@pytest.mark.parametrize("fna, sanicap, command", [(0x0, 0x2, "nvme sanitize {path} --sanact=2"),
                                                   (0x0, 0x0, "nvme format {path} --ses=1 --force")])
def test_nvme_without_crypto_erase_uses_sanitize_else_a_user_data_erase(tmp_path, fna, sanicap, command):
    hw = make_disks(tmp_path, {"fna": fna, "sanicap": sanicap})
    erased, checked = erase_and_verify(hw, tmp_path, method="secure")
    disk = erased["disks"][0]
    assert command.format(path=disk["path"]) in disk["commands"] and checked["passed"]
    assert "--ses=2" not in " ".join(disk["commands"])


def test_ata_secure_erase_is_enhanced_when_the_drive_supports_it(tmp_path):
    hw = make_disks(tmp_path, {"name": "sda", "type": "ssd"})
    erased, checked = erase_and_verify(hw, tmp_path, method="secure")
    disk = erased["disks"][0]
    assert (disk["tool"], disk["method_type"]) == ("hdparm", "Purge")
    assert any("--security-erase-enhanced ********" in c for c in disk["commands"])  # the password is masked
    assert checked["passed"] and checked["disks"][0]["expectation"] == "changed"


def test_a_frozen_drive_falls_back_only_as_the_policy_says_and_the_fallback_is_recorded(tmp_path):
    hw = make_disks(tmp_path, {"name": "sda", "type": "ssd", "frozen": True})
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path))
    refused = execute("erase", {"erase_id": "e0", "key": KEY, "method": "secure", "allow_suspend": False}, ctx)
    assert not refused.ok and "sda is frozen" in refused.error and "allows no fallback from secure" in refused.error
    assert refused.result["disks"][0]["ok"] is False
    erased, checked = erase_and_verify(hw, tmp_path, method="secure", fallback="full", allow_suspend=False)
    disk = erased["disks"][0]
    assert (disk["requested"], disk["method"], disk["fallback_from"]) == ("secure", "full", "secure")
    assert "frozen" in disk["fallback_reason"] and disk["attempts"][0]["method"] == "secure"
    assert checked["passed"] and checked["disks"][0]["expectation"] == "zeros"


def test_ata_secure_erase_on_a_drive_without_enhanced_erase_is_the_normal_one_and_says_so(tmp_path):
    hw = make_disks(tmp_path, {"name": "sda", "type": "ssd", "enhanced_erase": False}, size=8 * MiB)
    erased, checked = erase_and_verify(hw, tmp_path, method="secure")
    disk = erased["disks"][0]
    erase_commands = [c for c in disk["commands"] if "--security-erase" in c]
    assert erase_commands == [f"hdparm --user-master u --security-erase ******** {disk['path']}"]
    assert (disk["method"], disk["tool"], disk["fallback_from"]) == ("secure", "hdparm", None)
    assert disk["method_type"] == "Clear"  # never claimed as the enhanced erase's Purge
    assert "normal mode" in disk["method_details"] and "enhanced" not in disk["method_details"]
    assert "enhanced" not in json.dumps({k: v for k, v in disk.items() if k != "tool_output"})
    assert checked["passed"] and checked["disks"][0]["expectation"] == "changed"


def rtcwake_calls(tmp_path) -> list[str]:
    log = tmp_path / "rtcwake.log"  # the lab's fake rtcwake logs beside the profile; it never suspends
    return log.read_text().splitlines() if log.exists() else []


def test_a_frozen_drive_is_unfrozen_by_a_suspend_to_ram_and_then_erased_as_asked(tmp_path):
    hw = make_disks(tmp_path, {"name": "sda", "type": "ssd", "frozen": True}, size=8 * MiB)
    erased, checked = erase_and_verify(hw, tmp_path, method="secure")  # no fallback: the secure erase itself
    disk = erased["disks"][0]
    assert rtcwake_calls(tmp_path) == ["rtcwake -m mem -s 10"]
    assert (disk["method"], disk["method_type"], disk["fallback_from"], disk["attempts"]) == (
        "secure", "Purge", None, [])
    commands = [c.split(" /")[0].replace(" ********", "") for c in disk["commands"]]
    assert commands == ["hdparm -I", "rtcwake -m mem -s 10", "hdparm -I",
                        "hdparm --user-master u --security-set-pass", "hdparm --user-master u --security-erase-enhanced",
                        "hdparm -I"]
    identified = [t["output"] for t in disk["tool_output"] if t["command"].startswith("hdparm -I")]
    assert "\tnot\tfrozen" not in identified[0] and "\tnot\tfrozen" in identified[1]  # frozen, then thawed
    assert checked["passed"]


def test_a_drive_the_suspend_does_not_unfreeze_falls_back_as_the_policy_says_with_the_suspend_recorded(tmp_path):
    hw = make_disks(tmp_path, {"name": "sda", "type": "ssd", "frozen": "always"}, size=8 * MiB)
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path))
    refused = execute("erase", {"erase_id": "e0", "key": KEY, "method": "secure"}, ctx)
    assert not refused.ok
    assert "sda is frozen" in refused.error and "still frozen after a suspend to RAM and resume" in refused.error
    assert "allows no fallback from secure" in refused.error
    assert refused.result["disks"][0]["ok"] is False
    erased, checked = erase_and_verify(hw, tmp_path, method="secure", fallback="full")
    disk = erased["disks"][0]
    assert (disk["requested"], disk["method"], disk["method_type"], disk["fallback_from"]) == (
        "secure", "full", "Clear", "secure")
    assert "still frozen after a suspend to RAM and resume" in disk["fallback_reason"]
    assert "rtcwake -m mem -s 10" in [c["command"] for c in disk["attempts"][0]["commands"]]
    assert rtcwake_calls(tmp_path) == ["rtcwake -m mem -s 10"] * 2
    assert checked["passed"] and checked["disks"][0]["expectation"] == "zeros"


def test_without_leave_to_suspend_a_frozen_drive_is_never_suspended_and_the_reason_says_so(tmp_path):
    hw = make_disks(tmp_path, {"name": "sda", "type": "ssd", "frozen": True}, size=8 * MiB)
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path))
    refused = execute("erase", {"erase_id": "e0", "key": KEY, "method": "secure", "allow_suspend": False}, ctx)
    assert not refused.ok and "the policy does not allow a suspend to unfreeze it" in refused.error
    erased, checked = erase_and_verify(hw, tmp_path, method="secure", fallback="full", allow_suspend=False)
    disk = erased["disks"][0]
    assert (disk["method"], disk["fallback_from"]) == ("full", "secure")
    assert "the policy does not allow a suspend" in disk["fallback_reason"]
    assert rtcwake_calls(tmp_path) == []
    assert checked["passed"]


def test_a_suspend_that_fails_is_reported_as_such_not_as_a_drive_that_stayed_frozen(tmp_path):
    hw = make_disks(tmp_path, {"name": "sda", "type": "ssd", "frozen": True}, size=8 * MiB)
    tools = Path(hw.profile["lab"]["tools"])
    (tools / "rtcwake").write_text("#!/bin/sh\necho 'rtcwake: /dev/rtc0: Permission denied' >&2\nexit 1\n")
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path))
    outcome = execute("erase", {"erase_id": "e0", "key": KEY, "method": "secure"}, ctx)
    assert not outcome.ok
    assert "the suspend to unfreeze it failed (rtcwake -m mem -s 10 exit 1: rtcwake: /dev/rtc0: Permission denied)" \
        in outcome.error


@pytest.mark.parametrize("method", ["metadata", "full", "secure"])
def test_an_erase_that_skips_a_region_is_caught_by_the_read_back(tmp_path, method):
    hw = make_disks(tmp_path, {"fault": "erase-skips-region"})
    erased, checked = erase_and_verify(hw, tmp_path, method=method)
    assert erased["disks"][0]["ok"]  # the erase itself reported success
    result = checked["disks"][0]
    assert not result["passed"] and not checked["passed"]
    assert result["canaries"]["survived"] >= 1
    assert any("canaries survived" in f for f in result["findings"])


@pytest.mark.parametrize("method", ["full", "secure"])
def test_a_thin_lab_disk_is_erased_and_verified_and_stays_sparse(tmp_path, method):
    hw = make_disks(tmp_path, {"thin": True})
    path = hw.disks()[0].path
    assert os.stat(path).st_blocks * 512 >= 32 * MiB  # full of tenant data
    erased, checked = erase_and_verify(hw, tmp_path, method=method)
    assert erased["disks"][0]["ok"] and checked["passed"]
    assert read(path).count(0) == 32 * MiB and os.path.getsize(path) == 32 * MiB
    assert os.stat(path).st_blocks * 512 < 2 * MiB  # the canaries, not the disk


@pytest.mark.parametrize("method", ["full", "secure"])
def test_a_thin_lab_disk_that_skips_a_region_is_still_caught(tmp_path, method):
    hw = make_disks(tmp_path, {"thin": True, "fault": "erase-skips-region"})
    _, checked = erase_and_verify(hw, tmp_path, method=method)
    assert not checked["passed"] and checked["disks"][0]["canaries"]["survived"] >= 1


def test_an_erase_that_fails_fails_the_command_with_the_device_s_words(tmp_path):
    hw = make_disks(tmp_path, {"fault": "erase-fails"}, {})
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path))
    outcome = execute("erase", {"erase_id": "e1", "key": KEY, "method": "full"}, ctx)
    assert not outcome.ok and "nvme0n1: full: writing zeros" in outcome.error and "Input/output error" in outcome.error
    assert [d["ok"] for d in outcome.result["disks"]] == [False, True]


def test_any_untouched_run_two_strata_long_is_caught_wherever_it_is(tmp_path, monkeypatch):
    hw = make_disks(tmp_path, {}, size=64 * MiB)
    path = hw.disks()[0].path
    snapshot = {}
    real_full = sanitize.METHOD_FUNCTIONS["full"]

    def full(disk, policy, hardware, progress):  # the disk as the erase found it: tenant data and canaries
        snapshot["before"] = read(disk.path)
        return real_full(disk, policy, hardware, progress)

    monkeypatch.setitem(sanitize.METHOD_FUNCTIONS, "full", full)
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path))
    assert execute("erase", {"erase_id": "e1", "key": KEY, "method": "full"}, ctx).ok
    original = snapshot["before"]
    erased_bytes = read(path)
    # 62 canaries stratified over 64 MiB (plus the first and last MiB): a hole two strata long always holds
    # a whole stratum, so its canary, wherever the hole is.
    hole = (2 * 64 * MiB // 62 // 4096 + 1) * 4096
    rng = random.Random(7)
    for _ in range(12):
        start = rng.randrange(0, 64 * MiB - hole, 4096)
        with open(path, "r+b") as f:
            f.seek(start)
            f.write(original[start:start + hole])  # as if the erase had skipped it
        result = execute("verify_erase", {"erase_id": "e1", "key": KEY}, ctx).result["disks"][0]
        assert result["canaries"]["survived"] >= 1, start
        assert not result["passed"]
        with open(path, "r+b") as f:
            f.seek(start)
            f.write(erased_bytes[start:start + hole])
    assert execute("verify_erase", {"erase_id": "e1", "key": KEY}, ctx).result["passed"]


def test_the_full_read_back_finds_what_a_sample_can_miss(tmp_path):
    hw = make_disks(tmp_path, {})
    path = hw.disks()[0].path
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path))
    assert execute("erase", {"erase_id": "e1", "key": KEY, "method": "full"}, ctx).ok
    state = json.loads((tmp_path / "vmetal-erase-e1.json").read_text())["disks"]["nvme0n1"]["prepared"]
    taken = {o // 4096 for o in state["canaries"]} | {b for o in state["samples"] for b in range(o // 4096, (o + state["chunk"]) // 4096)}
    block = next(b for b in range(300, 8000) if b not in taken)
    with open(path, "r+b") as f:
        f.seek(block * 4096)
        f.write(b"left over" * 100)
    sampled = execute("verify_erase", {"erase_id": "e1", "key": KEY}, ctx).result
    full = execute("verify_erase", {"erase_id": "e1", "key": KEY, "mode": "full"}, ctx).result
    assert sampled["passed"]
    assert not full["passed"] and full["disks"][0]["samples"]["dirty_at"] == [{"offset": block * 4096, "length": 4096}]
    assert full["disks"][0]["bytes_read"] >= 32 * MiB


def test_every_canary_is_written_and_read_with_o_direct(tmp_path, monkeypatch):
    hw = make_disks(tmp_path, {})
    path = hw.disks()[0].path
    opened = []
    real_open = os.open

    def spy(file, flags, *args, **kwargs):
        if str(file) == path:
            opened.append(flags)
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(verify.os, "open", spy)
    key = b"k" * 32
    the_plan = verify.plan(key, 32 * MiB, "full")
    prepared = verify.prepare(path, key, the_plan)
    assert opened and all(flags & os.O_DIRECT for flags in opened)
    with open(path, "r+b") as f:  # a buffered overwrite, as a careless erase would do it
        f.write(bytes(32 * MiB))
    opened.clear()
    result = verify.verify(path, key, prepared, expectation=verify.ZEROS)
    assert result["passed"] and opened and all(flags & os.O_DIRECT for flags in opened)


def test_where_o_direct_is_refused_the_erase_is_not_verified_and_nothing_falls_back(tmp_path, monkeypatch):
    hw = make_disks(tmp_path, {})
    real_open = os.open

    def no_direct(file, flags, *args, **kwargs):  # a filesystem without O_DIRECT (older tmpfs, some FUSE)
        if flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument")
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(verify.os, "open", no_direct)
    before = read(hw.disks()[0].path, 0, MiB)
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path))
    outcome = execute("erase", {"erase_id": "e1", "key": KEY, "method": "full"}, ctx)
    assert not outcome.ok and "O_DIRECT refused" in outcome.error and "cannot be verified" in outcome.error
    assert read(hw.disks()[0].path, 0, MiB) == before  # no canary written through the page cache either


def test_a_disk_that_drops_writes_is_caught_when_the_canaries_are_planted(tmp_path, monkeypatch):
    hw = make_disks(tmp_path, {})
    monkeypatch.setattr(verify.DirectIO, "write", lambda self, data, offset: None)
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path))
    outcome = execute("erase", {"erase_id": "e1", "key": KEY, "method": "full"}, ctx)
    assert not outcome.ok and "does not read back" in outcome.error


def test_a_verification_without_its_erase_record_fails(tmp_path):
    hw = make_disks(tmp_path, {})
    outcome = execute("verify_erase", {"erase_id": "never", "key": KEY}, Context(hardware=hw, tmp_dir=str(tmp_path)))
    assert not outcome.ok and "no record of erase never" in outcome.error


def test_disks_are_erased_in_parallel_under_the_concurrency_limit_with_progress(tmp_path, monkeypatch):
    hw = make_disks(tmp_path, {}, {}, {}, {}, size=4 * MiB)
    running, peak, lock = [0], [0], threading.Lock()
    real = sanitize.erase_disk

    def slow(disk, policy, hardware, progress):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.3)
        try:
            return real(disk, policy, hardware, progress)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(sanitize, "erase_disk", slow)
    reports = []
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path), progress=lambda p, m: reports.append((p, m)))
    outcome = execute("erase", {"erase_id": "e1", "key": KEY, "method": "full", "concurrency": 2}, ctx)
    assert outcome.ok and outcome.result["concurrency"] == 2
    assert peak[0] == 2
    assert reports[-1] == (100, "erase done")
    assert any("nvme3n1" in m and "nvme0n1" in m for _, m in reports)
    percents = [p for p, _ in reports]
    assert percents == sorted(percents) or max(percents) == 100


def test_another_key_at_verification_is_refused_not_read_as_canaries_gone(tmp_path):
    hw = make_disks(tmp_path, {"fault": "erase-skips-region"})
    ctx = Context(hardware=hw, tmp_dir=str(tmp_path))
    assert execute("erase", {"erase_id": "e1", "key": KEY, "method": "full"}, ctx).ok
    result = execute("verify_erase", {"erase_id": "e1", "key": "77" * 32}, ctx).result
    assert not result["passed"] and "the key differs" in result["disks"][0]["error"]


def test_a_plan_keeps_one_disk_untouched_and_erases_the_other_by_the_command_it_names(tmp_path):
    hw = make_disks(tmp_path, {}, {"sanicap": 0x3})
    kept_before = read(hw.disks()[0].path)
    erased, checked = erase_and_verify(hw, tmp_path, method="full", plan=[
        {"serial": "S0", "name": "nvme0n1", "keep": True, "methods": []},
        {"serial": "S1", "name": "nvme1n1", "keep": False, "methods": ["nvme-sanitize-crypto", "full"]}])
    kept, purged = erased["disks"]
    assert (kept["kept"], kept["method"]) == (True, "kept") and "canaries_planted" not in kept
    assert read(hw.disks()[0].path) == kept_before  # not a canary written on it
    assert (purged["method"], purged["method_type"], purged["fallback_from"]) == ("nvme-sanitize-crypto", "Purge",
                                                                                  None)
    assert any("--sanact=4" in c for c in purged["commands"])
    assert [d["name"] for d in checked["disks"]] == ["nvme1n1"] and checked["passed"]


def test_a_named_purge_the_drive_does_not_offer_falls_back_as_the_plan_says_and_says_why(tmp_path):
    hw = make_disks(tmp_path, {"sanicap": 0x2, "fna": 0})  # block erase only: no crypto erase
    erased, checked = erase_and_verify(hw, tmp_path, plan=[
        {"serial": "S0", "name": "nvme0n1", "methods": ["crypto-erase", "nvme-sanitize-block", "full"]}])
    disk = erased["disks"][0]
    assert (disk["requested"], disk["method"], disk["method_type"]) == ("crypto-erase", "nvme-sanitize-block", "Purge")
    assert "does not offer crypto-format or sanitize-crypto" in disk["fallback_reason"]
    assert checked["passed"]
