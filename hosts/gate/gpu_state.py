"""The handover check of the GPUs' state: the agent's `gpu_state` report (nvidia-smi's own output, before and after
the reset) checked for shape, parsed and compared with the NodeType's defaults (pools/gpu.py). Pure functions."""
# The agent reports what nvidia-smi printed; the console parses and judges, and never takes the agent's word: a
# GPU passes only when what was read back after the reset is the NodeType's state (MIG mode and instances,
# persistence mode, application clocks and power limit at the GPU's defaults) and its memory is sound, judged as
# DCGM's health checks judge it:
# - a volatile uncorrectable ECC error (DCGM_FR_VOLATILE_DBE_DETECTED) fails it;
# - a page retirement or a row remap pending (DCGM_FR_PENDING_PAGE_RETIREMENTS, DCGM_FR_PENDING_ROW_REMAP), or a
#   row remap that failed (DCGM_FR_ROW_REMAP_FAILURE), fails it;
# - 63 retired pages or more, single- and double-bit together (DCGM_LIMIT_MAX_RETIRED_PAGES,
#   DCGM_FR_RETIRED_PAGES_LIMIT), fail it.
# Corrected errors are shown, not judged.
from __future__ import annotations

import csv
import io
import re

STATE_FIELDS = ("index,pci.bus_id,uuid,name,mig.mode.current,mig.mode.pending,persistence_mode,"
                "clocks.applications.graphics,clocks.default_applications.graphics,clocks.applications.memory,"
                "clocks.default_applications.memory,power.limit,power.default_limit,"
                "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,"
                "ecc.errors.uncorrected.aggregate.total,retired_pages.sbe,retired_pages.dbe,"
                "retired_pages.pending").split(",")
REMAP_FIELDS = ("gpu_bus_id", "gpu_uuid", "remapped_rows.correctable", "remapped_rows.uncorrectable",
                "remapped_rows.pending", "remapped_rows.failure")
MAX_RETIRED_PAGES = 63  # DCGM_LIMIT_MAX_RETIRED_PAGES
MAX_GPUS = 64
MAX_ACTIONS = 64 * 12
MAX_TEXT = 512 * 1024
INSTANCE = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")
YES = ("yes", "true", "1")


# --- shape -------------------------------------------------------------------------------------------

def _run_problems(run, where: str) -> list[str]:
    if not isinstance(run, dict):
        return [f"{where}: not an object"]
    problems = []
    if not isinstance(run.get("command"), str):
        problems.append(f"{where}.command: not a string")
    if not isinstance(run.get("exit_code"), int) or isinstance(run.get("exit_code"), bool):
        problems.append(f"{where}.exit_code: not a whole number")
    for key in ("stdout", "stderr"):
        if not isinstance(run.get(key, ""), str) or len(run.get(key, "")) > MAX_TEXT:
            problems.append(f"{where}.{key}: not a string of at most {MAX_TEXT} characters")
    return problems


def _state_problems(state, where: str) -> list[str]:
    if not isinstance(state, dict):
        return [f"{where}: not an object"]
    problems = _run_problems(state.get("query"), f"{where}.query") + _run_problems(state.get("remapped"),
                                                                                    f"{where}.remapped")
    instances = state.get("instances")
    if not isinstance(instances, dict) or len(instances) > MAX_GPUS:
        return problems + [f"{where}.instances: not an object of at most {MAX_GPUS} GPUs"]
    for index, run in instances.items():
        if not str(index).isdigit():
            problems.append(f"{where}.instances: {str(index)[:20]!r} is not a GPU index")
        problems += _run_problems(run, f"{where}.instances.{str(index)[:20]}")
    return problems


def report_problems(result) -> list[str]:
    """What is wrong with the shape of a `gpu_state` report ([] when nothing): a report that fails this is refused,
    whatever it says."""
    if not isinstance(result, dict):
        return ["the report is not an object"]
    if "skipped" in result:
        return [] if isinstance(result["skipped"], str) else ["skipped: not a string"]
    problems = _state_problems(result.get("before"), "before")
    if result.get("after") is not None:
        problems += _state_problems(result["after"], "after")
    actions = result.get("actions")
    if not isinstance(actions, list) or len(actions) > MAX_ACTIONS:
        problems.append(f"actions: not a list of at most {MAX_ACTIONS} commands")
    else:
        for n, run in enumerate(actions):
            problems += _run_problems(run, f"actions[{n}]")
    if not isinstance(result.get("errors", []), list):
        problems.append("errors: not a list")
    return problems[:10]


# --- parsing -----------------------------------------------------------------------------------------

def _csv(text: str) -> list[list[str]]:
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(text or ""), skipinitialspace=True)
            if row and row[0].strip()]


def _int(text):
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def _float(text):
    try:
        return float(str(text).split()[0])
    except (TypeError, ValueError, IndexError):
        return None


def parse_state(state: dict | None) -> dict[str, dict]:
    """{index: {mig, mig_pending, instances, persistence, clocks, power, ecc, ...}} from nvidia-smi's output."""
    if not state or state["query"].get("exit_code") != 0:
        return {}
    gpus = {}
    for row in _csv(state["query"].get("stdout", "")):
        if not row[0].isdigit() or len(row) < len(STATE_FIELDS):
            continue
        v = dict(zip(STATE_FIELDS, row))
        gpus[v["index"]] = {
            "bus": v["pci.bus_id"], "uuid": v["uuid"], "name": v["name"],
            "mig": v["mig.mode.current"], "mig_pending": v["mig.mode.pending"], "instances": None,
            "persistence": v["persistence_mode"],
            "app_clocks": [_int(v["clocks.applications.graphics"]), _int(v["clocks.applications.memory"])],
            "default_clocks": [_int(v["clocks.default_applications.graphics"]),
                               _int(v["clocks.default_applications.memory"])],
            "power_limit": _float(v["power.limit"]), "default_power_limit": _float(v["power.default_limit"]),
            "ecc": {"corrected_volatile": _int(v["ecc.errors.corrected.volatile.total"]),
                    "uncorrected_volatile": _int(v["ecc.errors.uncorrected.volatile.total"]),
                    "uncorrected_aggregate": _int(v["ecc.errors.uncorrected.aggregate.total"]),
                    "retired_sbe": _int(v["retired_pages.sbe"]), "retired_dbe": _int(v["retired_pages.dbe"]),
                    "retirement_pending": v["retired_pages.pending"].lower() in YES},
        }
    by_bus = {g["bus"].lower(): g for g in gpus.values()}
    if state["remapped"].get("exit_code") == 0:
        for row in _csv(state["remapped"].get("stdout", "")):
            r = dict(zip(REMAP_FIELDS, row))
            gpu = by_bus.get(r.get("gpu_bus_id", "").lower())
            if gpu is not None and len(row) == len(REMAP_FIELDS):
                gpu["ecc"].update(remapped_uncorrectable=_int(r["remapped_rows.uncorrectable"]),
                                  remap_pending=r["remapped_rows.pending"].lower() in YES,
                                  remap_failure=r["remapped_rows.failure"].lower() in YES)
    for index, gpu in gpus.items():
        if gpu["mig"] != "Enabled" and gpu["mig_pending"] != "Enabled":
            gpu["instances"] = []
            continue
        run = state["instances"].get(index)
        if run is None:
            continue  # MIG on and its instances not read: unknown, which fails
        if run.get("exit_code") == 6 and "not found" in (run.get("stdout", "") + run.get("stderr", "")).lower():
            gpu["instances"] = []
        elif run.get("exit_code") == 0:
            gpu["instances"] = sorted(m.group(2) for line in run.get("stdout", "").splitlines()
                                      if (m := INSTANCE.match(line.strip())))
    return gpus


# --- the verdict -------------------------------------------------------------------------------------

def _mig_text(gpu: dict | None) -> str:
    if gpu is None:
        return "not read"
    if gpu["mig"] != "Enabled":
        return gpu["mig"] + (f" (pending {gpu['mig_pending']})" if gpu["mig_pending"] != gpu["mig"] else "")
    if gpu["instances"] is None:
        return "Enabled (instances not read)"
    return f"Enabled: {', '.join(gpu['instances']) or 'no instances'}"


def _clocks_text(gpu: dict | None) -> str:
    if gpu is None:
        return "not read"
    return f"{gpu['app_clocks'][0]}/{gpu['app_clocks'][1]} MHz"


def memory_reasons(ecc: dict) -> list[str]:
    """The memory findings that fail a GPU, as DCGM's health checks name them."""
    reasons = []
    if ecc.get("uncorrected_volatile"):
        reasons.append(f"{ecc['uncorrected_volatile']} uncorrectable ECC error(s) since the driver loaded "
                       "(DCGM_FR_VOLATILE_DBE_DETECTED)")
    if ecc.get("retirement_pending"):
        reasons.append("a page retirement is pending (DCGM_FR_PENDING_PAGE_RETIREMENTS)")
    retired = (ecc.get("retired_sbe") or 0) + (ecc.get("retired_dbe") or 0)
    if retired >= MAX_RETIRED_PAGES:
        reasons.append(f"{retired} retired pages, the limit is {MAX_RETIRED_PAGES} (DCGM_FR_RETIRED_PAGES_LIMIT)")
    if ecc.get("remap_pending"):
        reasons.append("a row remap is pending: the GPU needs a reset (DCGM_FR_PENDING_ROW_REMAP)")
    if ecc.get("remap_failure"):
        reasons.append("a row remap failed (DCGM_FR_ROW_REMAP_FAILURE)")
    return reasons


def judge(result: dict, *, expected_gpus: int, want: dict, failure: str = "") -> dict:
    """The handover verdict: {verdict, reasons, gpus: {index: {status, tests: {what: "before → after"}, reasons,
    before, after}}, want}. `want`: pools.gpu.node_type_gpu's answer; `failure`: the agent's error, if it failed."""
    reasons: list[str] = [failure] if failure else []
    problems = report_problems(result)
    out = {"verdict": "fail", "reasons": reasons, "gpus": {}, "want": want}
    if problems:
        reasons.append("malformed gpu_state report: " + "; ".join(problems[:3]))
        return out
    if "skipped" in result:
        if expected_gpus:
            reasons.append(f"the agent skipped the GPU state check ({result['skipped']}); {expected_gpus} GPU(s) "
                           "expected")
        out["verdict"] = "fail" if reasons else "pass"
        return out
    before, after = parse_state(result.get("before")), parse_state(result.get("after"))
    if result.get("after") is None or not after:
        reasons.append("nothing was read back after the reset")
    elif len(after) < expected_gpus:
        reasons.append(f"{len(after)} GPU(s) read back; {expected_gpus} expected")
    persistence = "Enabled" if want["persistenceMode"] else "Disabled"
    for index in sorted(set(before) | set(after), key=int):
        b, a = before.get(index), after.get(index)
        found: list[str] = []
        tests = {"MIG": f"{_mig_text(b)} → {_mig_text(a)}",
                 "persistence": f"{b['persistence'] if b else 'not read'} → {a['persistence'] if a else 'not read'}",
                 "application clocks": f"{_clocks_text(b)} → {_clocks_text(a)}",
                 "power limit": f"{b['power_limit'] if b else 'not read'} → {a['power_limit'] if a else 'not read'} W"}
        if a is None:
            found.append("not read back after the reset")
        else:
            if b is not None and b["uuid"] != a["uuid"]:
                found.append(f"another GPU at index {index} after the reset ({b['uuid']} → {a['uuid']})")
            if want["mig"]:
                if a["mig"] != "Enabled" or a["mig_pending"] != "Enabled":
                    found.append(f"MIG mode {a['mig']} (pending {a['mig_pending']}); the NodeType's layout needs it "
                                 "enabled")
                elif a["instances"] != want["migLayout"]:
                    found.append(f"MIG instances {', '.join(a['instances'] or []) or 'none'} "
                                 f"{'(not read)' if a['instances'] is None else ''}; the NodeType declares "
                                 f"{', '.join(want['migLayout'])}".replace("  ", " "))
            elif a["mig"] == "Enabled" or a["mig_pending"] == "Enabled":
                found.append(f"MIG still enabled ({_mig_text(a)}); the NodeType declares none")
            if a["persistence"] != persistence:
                found.append(f"persistence mode {a['persistence']}; the NodeType declares {persistence}")
            if None not in a["default_clocks"] and a["app_clocks"] != a["default_clocks"]:
                found.append(f"application clocks {_clocks_text(a)}, not the defaults "
                             f"{a['default_clocks'][0]}/{a['default_clocks'][1]} MHz")
            if (a["default_power_limit"] is not None and a["power_limit"] is not None
                    and abs(a["power_limit"] - a["default_power_limit"]) > 0.5):
                found.append(f"power limit {a['power_limit']:g} W, not the default {a['default_power_limit']:g} W")
            memory = memory_reasons(a["ecc"])
            found += memory
            tests["memory"] = "; ".join(memory) or "sound"
        out["gpus"][index] = {"status": "fail" if found else "pass", "tests": tests, "reasons": found,
                              "before": b, "after": a}
        reasons += [f"GPU {index}: {r}" for r in found]
    out["verdict"] = "fail" if reasons else "pass"
    return out
