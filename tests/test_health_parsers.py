"""The health parsers on real outputs of DCGM 3.x, DCGM 4.x and nccl-tests (tests/fixtures/health/, each with
its source on its first line), and on the ways an output can fail to be a result: never a pass."""
import json
import re
from pathlib import Path

import pytest
from django.core.management import call_command

from hosts.gate.health import parse_dcgmi, parse_nccl

FIXTURES = Path(__file__).parent / "fixtures" / "health"


def fixture(name: str) -> str:
    header, body = (FIXTURES / name).read_text().split("\n", 1)
    assert header.startswith("# source: "), f"{name} does not say where it came from"
    return body


def issue_215_document() -> str:
    """The one test object NVIDIA/DCGM#215 quotes from a real DCGM 4 run, in a 4.x document around it."""
    test = fixture("dcgmi-4.x-diagnostic-test-8gpu.txt").strip().rstrip(",")
    return '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [' + test + "]}]}}"


def test_every_fixture_names_its_source():
    for path in FIXTURES.glob("*.txt"):
        assert path.read_text().startswith("# source: "), path.name


# --- DCGM 3.x ---------------------------------------------------------------------------------------

def test_dcgm_3x_r2_passes_with_its_tests_per_gpu():
    result = parse_dcgmi(fixture("dcgmi-3.x-r2-pass.txt"), 0)
    assert result["verdict"] == "pass" and result["reasons"] == [] and result["format"] == "3.x"
    assert result["gpus"]["0"]["tests"] == {"PCIe": "pass", "GPU Memory": "pass"}
    assert result["gpus"]["all"]["tests"]["Persistence Mode"] == "pass"  # Deployment tests name no GPU
    assert len(result["tests"]) == 11


def test_dcgm_3x_r3_with_a_skipped_test_still_passes_and_says_so():
    result = parse_dcgmi(fixture("dcgmi-3.x-r3-pass-with-skip.txt"), 0)
    assert result["verdict"] == "pass"
    assert result["gpus"]["0"]["tests"]["EUD Test"] == "skip"
    assert result["counts"] == {"pass": 15, "fail": 0, "skip": 1}


def test_dcgm_3x_document_whose_root_is_a_list_is_not_a_result():
    result = parse_dcgmi(fixture("dcgmi-3.x-root-is-a-list.txt"), 0)
    assert result["verdict"] == "fail"
    assert result["reasons"] == ["not a result document: 'DCGM GPU Diagnostic' holds a list, not an object"]


@pytest.mark.parametrize("code, words", [(226, "DCGM_ST_NVVS_ERROR"), (205, "DCGM_ST_NVVS_ISOLATE_ERROR"),
                                         (203, "killed"), (1, "a failure")])
def test_a_failing_exit_code_fails_even_when_every_test_says_pass(code, words):
    result = parse_dcgmi(fixture("dcgmi-3.x-r2-pass.txt"), code)
    assert result["verdict"] == "fail"
    assert result["reasons"][0].startswith(f"dcgmi exited {code}") and words in result["reasons"][0]
    assert all(t["status"] == "pass" for t in result["tests"])


# --- DCGM 4.x ---------------------------------------------------------------------------------------

def test_dcgm_4x_gb10_document_fails_in_dcgm_s_own_words():
    text = fixture("dcgmi-4.x-gb10-r1-exit226.txt")
    for code in (226, None):  # the warning is a Fail in the JSON itself
        result = parse_dcgmi(text, code)
        assert result["verdict"] == "fail" and result["format"] == "4.x" and result["version"] == "4.2.3"
        assert result["driver_version"] == "580.82.09"
        assert ('software (GPU 0): Persistence Mode: Persistence mode for GPU 0 is disabled. Enable persistence mode '
                'by running "nvidia-smi -i <gpuId> -pm 1 " as root.') in result["reasons"]
        gpu = result["gpus"]["0"]
        assert gpu["status"] == "fail" and gpu["tests"] == {"software": "fail"} and gpu["serial"] == "<<<NOT_SUPPORTED>>>"


def test_dcgm_4x_entity_ids_give_per_gpu_detail_and_the_exit_code_still_counts():
    document = issue_215_document()
    passed = parse_dcgmi(document, 0)
    assert passed["verdict"] == "pass"
    assert sorted(passed["gpus"], key=int) == [str(i) for i in range(8)]
    assert all(g["tests"] == {"diagnostic": "pass"} for g in passed["gpus"].values())
    for code in (226, 205):
        assert parse_dcgmi(document, code)["verdict"] == "fail"


def test_dcgm_4x_test_summary_fail_fails_even_if_no_result_does():
    doc = json.loads(issue_215_document())
    doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["test_summary"] = {"status": "Fail",
                                                                                "info": ["GPU 4: throttled"]}
    result = parse_dcgmi(json.dumps(doc), 0)
    assert result["verdict"] == "fail" and result["reasons"] == ["diagnostic: GPU 4: throttled"]


# --- never a pass by accident ---------------------------------------------------------------------

@pytest.mark.parametrize("word", ["Inconclusive", "", "PASSED", "ok", None])
def test_an_unknown_status_word_is_never_read_as_a_pass(word):
    doc = json.loads(fixture("dcgmi-3.x-r2-pass.txt"))
    doc["DCGM GPU Diagnostic"]["test_categories"][2]["tests"][0]["results"][0]["status"] = word
    result = parse_dcgmi(json.dumps(doc), 0)
    assert result["verdict"] == "fail"
    assert result["reasons"] == [f"GPU Memory: unknown status {word!r} (not read as a pass)"]
    assert result["gpus"]["0"]["status"] == "fail"


def test_status_words_are_read_whatever_their_case_and_a_warning_is_a_failure():
    doc = json.loads(fixture("dcgmi-3.x-r2-pass.txt").replace('"Pass"', '"PASS"'))
    assert parse_dcgmi(json.dumps(doc), 0)["verdict"] == "pass"
    doc["DCGM GPU Diagnostic"]["test_categories"][1]["tests"][0]["results"][0].update(
        status="Warn", warnings=[{"warning": "GPU 0 host-side PCIe replay violation, see dmesg for more information",
                                  "error_id": 98}])
    result = parse_dcgmi(json.dumps(doc), 0)
    assert result["verdict"] == "fail"
    assert result["reasons"] == ["PCIe (GPU 0): GPU 0 host-side PCIe replay violation, see dmesg for more information"]


def test_a_run_where_every_test_was_skipped_verified_nothing():
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Skip",
                                        "info": ["Plugin is not allowed on this SKU"]}],
         "test_summary": {"status": "Skip"}}]}]}}
    result = parse_dcgmi(json.dumps(doc), 0)
    assert result["verdict"] == "fail" and result["reasons"] == ["every test was skipped: nothing was verified"]


@pytest.mark.parametrize("text, reason", [
    ("", "not a result document: no JSON object in the output (no output at all)"),
    ("Error: unable to establish a connection to the specified host: localhost\n",
     "not a result document: no JSON object in the output (Error: unable to establish a connection"),
    ("{not json", "not a result document: no JSON object"),
    ('{"results": []}', "not a DCGM diagnostic document: no 'DCGM GPU Diagnostic' or 'DCGM Diagnostic' key"),
    ('{"DCGM Diagnostic": {"version": "4.1.1", "runtime_error": "Could not run the diagnostic: no GPUs"}}',
     "runtime error: Could not run the diagnostic: no GPUs"),
    ('{"DCGM GPU Diagnostic": {"test_categories": []}}', "not a result document: no test_categories"),
])
def test_output_that_is_not_a_result_document_fails_with_that_reason(text, reason):
    result = parse_dcgmi(text, 0)
    assert result["verdict"] == "fail"
    assert any(r.startswith(reason) for r in result["reasons"]), result["reasons"]


def test_iterations_pass_only_when_every_iteration_and_the_overall_result_pass():
    one = json.loads(fixture("dcgmi-3.x-r2-pass.txt"))
    doc = {"iterations": [one, one], "Overall Result": "Pass"}
    assert parse_dcgmi(json.dumps(doc), 0)["verdict"] == "pass"
    doc["Overall Result"] = "Fail"
    assert parse_dcgmi(json.dumps(doc), 0)["reasons"] == ["Overall Result: Fail"]


# --- nccl-tests -------------------------------------------------------------------------------------

def test_nccl_is_judged_on_the_largest_message_not_on_the_avg_line():
    text = fixture("nccl-all_reduce_perf-2x8-H100.txt")
    result = parse_nccl(text, min_busbw=300)
    # "Avg bus bandwidth: 70.742" averages 8 B to 8 GiB; at 8 GiB this fabric moves 337 GB/s.
    assert result["verdict"] == "pass" and result["avg_busbw_gbps"] == 70.742
    assert result["message_bytes"] == 8589934592 and result["busbw_gbps"] == 337.35  # the lower of 338.82 / 337.35
    assert len(result["rows"]) == 31 and len(result["gpus"]) == 16
    assert result["gpus"][8] == {"rank": 8, "host": "ztan-mig-gq73", "device": 0, "bus": "0000:04:00",
                                 "name": "NVIDIA H100 80GB HBM3"}
    slow = parse_nccl(text, min_busbw=400)
    assert slow["verdict"] == "fail"
    assert slow["reasons"] == ["busbw 337.35 GB/s at 8589934592 bytes is below the threshold 400 GB/s "
                               "(out-of-place 338.82, in-place 337.35)"]


def _report_from(text: str, **changes) -> str:
    """A `-J` report with the rows of the real table, in the shape nccl-tests' src/util.cu writes."""
    rows = []
    for line in text.splitlines():
        cells = line.split()
        if len(cells) == 13 and cells[0].isdigit():
            rows.append({"size": int(cells[0]), "count": int(cells[1]), "type": cells[2], "redop": cells[3],
                         "root": f"{int(cells[4]):6d}",
                         "out_of_place": {"time": float(cells[5]), "alg_bw": float(cells[6]),
                                          "bus_bw": float(cells[7]), "nwrong": float(cells[8])},
                         "in_place": {"time": float(cells[9]), "alg_bw": float(cells[10]),
                                      "bus_bw": float(cells[11]), "nwrong": float(cells[12])},
                         "actual_iterations": 20, "experiment_name": "all_reduce_perf"})
    report = {"version": 2, "nccl_version": 22703, "config": {"ngpus": 1, "devices": []}, "results": rows,
              "out_of_bounds": {"count": 0, "okay": "true"},
              "average_bus_bandwidth": {"bandwidth": 70.742, "okay": "unchecked"}, "errors": []}
    report.update(changes)
    return json.dumps(report)


def test_nccl_json_report_gives_the_same_verdict_as_its_table():
    text = fixture("nccl-all_reduce_perf-2x8-H100.txt")
    result = parse_nccl("", json_text=_report_from(text), min_busbw=300)
    assert result["source"] == "json" and result["verdict"] == "pass" and result["busbw_gbps"] == 337.35
    assert parse_nccl("", json_text=_report_from(text), min_busbw=400)["verdict"] == "fail"
    bad = parse_nccl("", json_text=_report_from(text, out_of_bounds={"count": 3, "okay": "false"}), min_busbw=300)
    assert bad["verdict"] == "fail" and bad["reasons"] == ["out of bounds values: 3 (okay: false)"]


@pytest.mark.parametrize("edit, reason", [
    (lambda t: t.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 4 FAILED"),
     "Out of bounds values : 4 FAILED"),
    (lambda t: re.sub(r"(8589934592\s+2147483648\s+float\s+sum\s+-1\s+47535\s+180.71\s+338.82)\s+0", r"\1      7", t),
     "8589934592 bytes: #wrong 7"),
    (lambda t: t.split("# Out of bounds")[0], "the output ends before nccl-tests' footer"),
    (lambda t: "\n".join(ln for ln in t.splitlines() if ln.startswith("#")), "not a result document: no result rows"),
    (lambda t: t.replace("337.35", "nan").replace("338.82", "nan"), "8589934592 bytes: no bus bandwidth figure"),
])
def test_nccl_failures_in_nccl_s_own_words(edit, reason):
    result = parse_nccl(edit(fixture("nccl-all_reduce_perf-2x8-H100.txt")), min_busbw=300)
    assert result["verdict"] == "fail"
    assert any(r.startswith(reason) for r in result["reasons"]), result["reasons"]


def test_nccl_exit_code_and_garbage_are_failures():
    text = fixture("nccl-all_reduce_perf-2x8-H100.txt")
    assert parse_nccl(text, exit_code=1, min_busbw=300)["reasons"][0] == "all_reduce_perf exited 1"
    result = parse_nccl("Invalid number of GPUs: 8 requested but only 7 were found.\n", min_busbw=400)
    assert result["reasons"] == ["not a result document: no result rows (Invalid number of GPUs: 8 requested but "
                                 "only 7 were found.)"]


# --- manage.py health-parse ---------------------------------------------------------------------------

def run_command(capsys, *args) -> tuple[int, dict]:
    capsys.readouterr()
    try:
        call_command("health-parse", *args)
        status = 0
    except SystemExit as exc:
        status = exc.code
    return status, json.loads(capsys.readouterr().out)


def test_health_parse_prints_the_verdict_as_json(tmp_path, capsys):
    dcgm = tmp_path / "dcgm.json"
    dcgm.write_text(fixture("dcgmi-4.x-gb10-r1-exit226.txt"))
    status, out = run_command(capsys, "dcgmi", str(dcgm), "--exit-code", "226")
    assert status == 1 and out["verdict"] == "fail" and out["gpus"]["0"]["status"] == "fail"
    assert out["reasons"][0] == "dcgmi exited 226 (DCGM_ST_NVVS_ERROR: a diagnostic test failed)"
    good = tmp_path / "good.json"
    good.write_text(fixture("dcgmi-3.x-r2-pass.txt"))
    status, out = run_command(capsys, "dcgmi", str(good))
    assert status == 0 and out["verdict"] == "pass" and out["reasons"] == []

    table = tmp_path / "nccl.txt"
    table.write_text(fixture("nccl-all_reduce_perf-2x8-H100.txt"))
    status, out = run_command(capsys, "nccl", str(table), "--min-busbw", "400")
    assert status == 1 and out["verdict"] == "fail" and out["busbw_gbps"] == 337.35 and len(out["gpus"]) == 16
    report = tmp_path / "nccl.json"
    report.write_text(_report_from(table.read_text()))
    status, out = run_command(capsys, "nccl", str(table), "--json-report", str(report), "--min-busbw", "300")
    assert status == 0 and out["verdict"] == "pass" and out["source"] == "json"

    junk = tmp_path / "junk.txt"
    junk.write_text("Segmentation fault (core dumped)\n")
    for tool in ("dcgmi", "nccl"):
        status, out = run_command(capsys, tool, str(junk))
        assert status == 1 and out["verdict"] == "fail" and "not a result document" in out["reasons"][-1]


def test_health_parse_reads_dcgm_3_3_gpu_id_results_per_gpu_and_names_the_failing_gpu(tmp_path, capsys):
    document = tmp_path / "dcgm-3.3.json"
    document.write_text(fixture("dcgmi-3.3-r2-gpu2-memory-fail.txt"))
    for args in (["--exit-code", "205"], []):  # the Fail in the JSON fails the run without the exit code too
        status, out = run_command(capsys, "dcgmi", str(document), *args)
        assert status == 1 and out["verdict"] == "fail" and out["format"] == "3.x" and out["version"] == "3.3.9"
        assert sorted(out["gpus"]) == ["0", "1", "2", "3", "all"]  # one entry per gpu_id, none lumped into "all"
        for healthy in ("0", "1", "3"):
            assert out["gpus"][healthy] == {"status": "pass", "tests": {"PCIe": "pass", "GPU Memory": "pass"},
                                            "reasons": []}
        assert out["gpus"]["2"] == {"status": "fail", "tests": {"PCIe": "pass", "GPU Memory": "fail"},
                                    "reasons": ["Found 12 faulty memory elements on GPU 2"]}
        assert out["gpus"]["all"]["tests"]["Persistence Mode"] == "pass" and out["gpus"]["all"]["status"] == "pass"
        assert out["reasons"][-1] == "GPU Memory (GPU 2): Found 12 faulty memory elements on GPU 2"
    assert out["reasons"] == ["GPU Memory (GPU 2): Found 12 faulty memory elements on GPU 2"]
    healed = tmp_path / "dcgm-3.3-healed.json"
    doc = json.loads(document.read_text())
    doc["DCGM GPU Diagnostic"]["test_categories"][2]["tests"][0]["results"][2] = {"gpu_id": "2", "status": "Pass"}
    healed.write_text(json.dumps(doc))
    status, out = run_command(capsys, "dcgmi", str(healed), "--exit-code", "0")
    assert status == 0 and out["verdict"] == "pass" and out["gpus"]["2"]["tests"] == {"PCIe": "pass",
                                                                                      "GPU Memory": "pass"}


@pytest.mark.parametrize("version, fmt, name", [("3.3.9", "3.x", "GPU Memory"), ("4.2.3", "4.x", "memory")])
def test_the_lab_s_fake_dcgmi_speaks_both_formats_the_way_the_real_ones_read(version, fmt, name):
    from lab import fake_tools

    failures = {("memory", 5): {"warning": "Found 12 faulty memory elements on GPU 5", "error_id": 52,
                                "error_category": 10, "error_severity": 2}}
    tests = [("Integration", "pcie", "PCIe"), ("Hardware", "memory", "GPU Memory")]
    make = fake_tools._dcgm4 if version.startswith("4") else fake_tools._dcgm3
    result = parse_dcgmi(json.dumps(make(version, list(range(8)), tests, failures)), 205)
    assert result["format"] == fmt and result["version"] == version and result["verdict"] == "fail"
    assert result["gpus"]["5"]["tests"][name] == "fail" and result["gpus"]["4"]["status"] == "pass"
    assert f"{name} (GPU 5): Found 12 faulty memory elements on GPU 5" in result["reasons"]
    healthy = parse_dcgmi(json.dumps(make(version, list(range(8)), tests, {})), 0)
    every = {str(i) for i in range(8)} | ({"all"} if fmt == "3.x" else set())  # 3.x Deployment names no GPU
    assert healthy["verdict"] == "pass" and set(healthy["gpus"]) == every
