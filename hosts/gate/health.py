"""GPU health verdicts from the tools' own output (`dcgmi diag -j`, nccl-tests' `all_reduce_perf`): pure
functions, no Django."""
# GPU health verdicts from the tools' own output: `dcgmi diag -j` (DCGM 3.x and 4.x) and nccl-tests'
# `all_reduce_perf` (text table or `-J` JSON). Pure functions, no Django: `manage.py health-parse` and the
# flow's health steps call the same code.
#
# Rules, all fail-closed:
# - output that is not a result document (no JSON, wrong root, no tests, no result rows) is a failure, with
#   that reason;
# - a status word that is not Pass, Skip or Fail is never read as a pass;
# - DCGM: a warning is rendered as Fail in JSON (so it fails); exit code 226 (DCGM_ST_NVVS_ERROR) or 205
#   (DCGM_ST_NVVS_ISOLATE_ERROR), or any non-zero exit, fails the run even when every test says Pass; a run
#   where every test was skipped verified nothing and fails;
# - NCCL: judged on the bus bandwidth at the largest message size of the sweep (the lower of out-of-place and
#   in-place) against the threshold, never on the "Avg bus bandwidth" line, which averages the small sizes
#   too; wrong results or out-of-bounds values fail.
# Reasons quote the tools' own words (DCGM's warnings, nccl-tests' footer).
from __future__ import annotations

import json
import math
import re

DCGM_ROOTS = ("DCGM GPU Diagnostic", "DCGM Diagnostic")  # 3.x, 4.x
# dcgmReturn_t values modulo 256, as the dcgmi process exits with them.
DCGM_EXIT = {0: "success", 226: "DCGM_ST_NVVS_ERROR: a diagnostic test failed",
             205: "DCGM_ST_NVVS_ISOLATE_ERROR: isolate the GPU (a failure that needs the GPU taken out)",
             203: "DCGM_ST_NVVS_KILLED: the diagnostic was killed", 198: "DCGM_ST_NVVS_NO_AVAILABLE_TEST: no test "
             "could run", 124: "timed out", 127: "dcgmi not found"}
STATUS_WORDS = {"pass": "pass", "fail": "fail", "skip": "skip", "warn": "fail", "warning": "fail"}
GPU_GROUP_IDS = (1,)  # DCGM_FE_GPU


def _verdict(reasons: list[str]) -> str:
    return "fail" if reasons else "pass"


def _extract_json(text: str):
    """The JSON document in `text` (dcgmi may print a line before it). None when there is none."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        return json.loads(text[start:end + 1])
    except ValueError:
        return None


def _status(word) -> str:
    return STATUS_WORDS.get(str(word).strip().lower(), "unknown") if word is not None else "missing"


def _texts(value) -> list[str]:
    """warnings / info as DCGM prints them: a string, a list of strings, or a list of {"warning": ...}."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    out = []
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                text = item.get("warning") or item.get("message") or item.get("info")
                if text:
                    out.append(str(text))
            elif item not in (None, ""):
                out.append(str(item))
    return out


def _gpu_ids(result: dict) -> list[str]:
    """gpu_ids "0,1" (≤ 3.2), gpu_id (3.3), entity_id with entity_group GPU (4.x); [] = every GPU."""
    for key in ("gpu_ids", "gpu_id"):
        if key in result and result[key] not in (None, ""):
            return [g.strip() for g in str(result[key]).split(",") if g.strip()]
    if "entity_id" in result:
        group = result.get("entity_group", "GPU")
        group_id = result.get("entity_group_id", 1)
        if str(group).upper() == "GPU" or group_id in GPU_GROUP_IDS:
            return [str(result["entity_id"])]
        return [f"{group}:{result['entity_id']}"]
    return []


def parse_dcgmi(text: str, exit_code: int | None = None) -> dict:
    """`dcgmi diag -r N -j` output → {verdict, reasons, gpus, tests, version, exit_code}."""
    reasons: list[str] = []
    out = {"tool": "dcgmi", "verdict": "fail", "reasons": reasons, "gpus": {}, "tests": [], "version": None,
           "format": None, "exit_code": exit_code}
    if exit_code not in (None, 0):
        reasons.append(f"dcgmi exited {exit_code} ({DCGM_EXIT.get(exit_code, 'a failure')})")
    doc = _extract_json(text or "")
    if not isinstance(doc, dict):
        first = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "no output at all")
        reasons.append(f"not a result document: no JSON object in the output ({first[:300]})")
        return out
    if "iterations" in doc and isinstance(doc["iterations"], list):  # --iterations N
        runs = [parse_dcgmi(json.dumps(it)) for it in doc["iterations"]]
        for i, run in enumerate(runs):
            reasons += [f"iteration {i + 1}: {r}" for r in run["reasons"]]
            for gpu, detail in run["gpus"].items():
                merged = out["gpus"].setdefault(gpu, {"status": "pass", "tests": {}, "reasons": []})
                merged["tests"].update(detail["tests"])
                merged["reasons"] += detail["reasons"]
                if detail["status"] != "pass":
                    merged["status"] = "fail"
        overall = doc.get("Overall Result")
        if overall is not None and _status(overall) != "pass":
            reasons.append(f"Overall Result: {overall}")
        out.update(verdict=_verdict(reasons), format="iterations", version=runs[0]["version"] if runs else None)
        if not runs:
            reasons.append("not a result document: an empty iterations list")
            out["verdict"] = "fail"
        return out
    root_key = next((k for k in DCGM_ROOTS if k in doc), None)
    if root_key is None:
        reasons.append(f"not a DCGM diagnostic document: no {' or '.join(repr(k) for k in DCGM_ROOTS)} key "
                       f"(keys: {', '.join(list(doc)[:8]) or 'none'})")
        return out
    root = doc[root_key]
    out["format"] = "3.x" if root_key == DCGM_ROOTS[0] else "4.x"
    if not isinstance(root, dict):
        reasons.append(f"not a result document: {root_key!r} holds a {type(root).__name__}, not an object")
        return out
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    out["version"] = metadata.get("version") or root.get("version") or doc.get("version")
    out["driver_version"] = metadata.get("Driver Version Detected") or root.get("Driver Version Detected")
    if root.get("runtime_error"):
        reasons.append(f"runtime error: {root['runtime_error']}")
    categories = root.get("test_categories")
    if not isinstance(categories, list) or not categories:
        if not root.get("runtime_error"):
            reasons.append("not a result document: no test_categories")
        return out
    serials = {}
    for group in doc.get("entity_groups") or []:
        if isinstance(group, dict) and str(group.get("entity_group", "GPU")).upper() == "GPU":
            for entity in group.get("entities") or []:
                if isinstance(entity, dict) and "entity_id" in entity:
                    serials[str(entity["entity_id"])] = entity.get("serial_num")
    gpus = out["gpus"]
    counts = {"pass": 0, "fail": 0, "skip": 0}

    def gpu(gid: str) -> dict:
        return gpus.setdefault(gid, {"status": "pass", "tests": {}, "reasons": [],
                                     **({"serial": serials[gid]} if serials.get(gid) else {})})

    for category in categories:
        if not isinstance(category, dict):
            reasons.append("not a result document: a test category is not an object")
            continue
        for test in category.get("tests") or []:
            if not isinstance(test, dict):
                continue
            name = str(test.get("name", "?"))
            statuses = []
            results = test.get("results") if isinstance(test.get("results"), list) else []
            for result in results:
                if not isinstance(result, dict):
                    continue
                status = _status(result.get("status"))
                statuses.append(status)
                said = _texts(result.get("warnings")) + ([] if status == "pass" else [])
                ids = _gpu_ids(result) or ["all"]
                for gid in ids:
                    g = gpu(gid)
                    g["tests"][name] = status if g["tests"].get(name) in (None, "pass", "skip") else g["tests"][name]
                    if status in ("fail", "unknown", "missing"):
                        g["status"] = "fail"
                        g["reasons"] += said or [f"{name}: {result.get('status')}"]
                if status in ("fail",):
                    where = f"GPU {','.join(ids)}" if ids != ["all"] else "all GPUs"
                    reasons += [f"{name} ({where}): {w}" for w in said] or [f"{name} ({where}): Fail"]
                elif status in ("unknown", "missing"):
                    reasons.append(f"{name}: unknown status {result.get('status')!r} (not read as a pass)")
            summary = test.get("test_summary")
            if isinstance(summary, dict):
                sstatus = _status(summary.get("status"))
                statuses.append(sstatus)
                if sstatus in ("unknown", "missing"):
                    reasons.append(f"{name}: unknown summary status {summary.get('status')!r} (not read as a pass)")
                elif sstatus == "fail" and not any(s == "fail" for s in statuses[:-1]):
                    said = _texts(summary.get("warnings")) or _texts(summary.get("info"))
                    reasons += [f"{name}: {w}" for w in said] or [f"{name}: Fail"]
            if not statuses:
                reasons.append(f"{name}: no result")
                continue
            worst = ("fail" if any(s in ("fail", "unknown", "missing") for s in statuses)
                     else "pass" if "pass" in statuses else "skip")
            counts[worst] += 1
            out["tests"].append({"category": category.get("category"), "name": name, "status": worst})
    if not out["tests"]:
        reasons.append("not a result document: no tests")
    elif counts["pass"] == 0 and counts["fail"] == 0:
        reasons.append("every test was skipped: nothing was verified")
    out["counts"] = counts
    out["verdict"] = _verdict(reasons)
    return out


# --- nccl-tests -------------------------------------------------------------------------------------

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+|\S+)\s+(.*)$")
DEVICE = re.compile(r"#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]+)\]\s+(.*)")
FOOTER_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s*(\S*)")
FOOTER_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+|nan)\s*(\S*)")


def _number(text):
    """A figure from the output; nan / inf (nccl-tests writes "nan") are no figure at all, never a pass."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def parse_nccl(text: str, *, json_text: str | None = None, exit_code: int | None = None,
               min_busbw: float | None = None) -> dict:
    """all_reduce_perf output (the table, or the `-J` report when given) → {verdict, reasons, busbw_gbps, ...}."""
    reasons: list[str] = []
    out = {"tool": "nccl", "verdict": "fail", "reasons": reasons, "busbw_gbps": None, "message_bytes": None,
           "min_busbw_gbps": min_busbw, "avg_busbw_gbps": None, "rows": [], "gpus": [], "source": None,
           "exit_code": exit_code}
    if exit_code not in (None, 0):
        reasons.append(f"all_reduce_perf exited {exit_code}")
    rows = []
    doc = None
    if json_text:
        try:
            doc = json.loads(json_text)
        except ValueError:
            reasons.append("the -J report is not JSON")
    if isinstance(doc, dict) and isinstance(doc.get("results"), list):
        out["source"] = "json"
        for r in doc["results"]:
            if not isinstance(r, dict):
                continue
            oop, inp = r.get("out_of_place") or {}, r.get("in_place") or {}
            rows.append({"size": int(r.get("size", 0)), "type": r.get("type"), "redop": r.get("redop"),
                         "oop_busbw": _number(oop.get("bus_bw")), "ip_busbw": _number(inp.get("bus_bw")),
                         "oop_algbw": _number(oop.get("alg_bw")), "ip_algbw": _number(inp.get("alg_bw")),
                         "wrong": [w for w in (oop.get("nwrong"), inp.get("nwrong")) if w not in (None, "N/A")]})
        oob = doc.get("out_of_bounds") or {}
        if oob and (str(oob.get("okay")).lower() not in ("true", "1") or int(oob.get("count") or 0)):
            reasons.append(f"out of bounds values: {oob.get('count')} (okay: {oob.get('okay')})")
        avg = doc.get("average_bus_bandwidth") or {}
        out["avg_busbw_gbps"] = _number(avg.get("bandwidth"))
        for d in doc.get("devices") or (doc.get("config") or {}).get("devices") or []:  # util.cu: inside config
            if isinstance(d, dict):
                out["gpus"].append({"rank": d.get("rank"), "host": d.get("hostname"), "device": d.get("device"),
                                    "bus": d.get("device_hex"), "name": d.get("device_info")})
        for error in doc.get("errors") or []:
            if error:
                reasons.append(f"nccl error: {error}")
    else:
        out["source"] = "text"
        oob_seen = False
        for line in (text or "").splitlines():
            device = DEVICE.match(line.strip())
            if device:
                out["gpus"].append({"rank": int(device[1]), "host": device[4], "device": int(device[5]),
                                    "bus": device[6], "name": device[7].strip()})
                continue
            oob = FOOTER_OOB.match(line.strip())
            if oob:
                oob_seen = True
                if int(oob[1]) or oob[2].upper() == "FAILED":
                    reasons.append(line.strip().lstrip("# ").strip())
                continue
            avg = FOOTER_AVG.match(line.strip())
            if avg:
                out["avg_busbw_gbps"] = _number(avg[1])
                if avg[2].upper() == "FAILED":
                    reasons.append(line.strip().lstrip("# ").strip())
                continue
            if line.lstrip().startswith("#"):
                continue
            row = ROW.match(line)
            if not row:
                continue
            cells = row[6].split()
            if len(cells) < 8:
                continue
            rows.append({"size": int(row[1]), "type": row[3], "redop": row[4],
                         "oop_algbw": _number(cells[1]), "oop_busbw": _number(cells[2]),
                         "ip_algbw": _number(cells[5]), "ip_busbw": _number(cells[6]),
                         "wrong": [w for w in (cells[3], cells[7]) if w != "N/A"]})
            if "error" in line.lower():
                reasons.append(line.strip())
        if rows and not oob_seen:
            reasons.append("the output ends before nccl-tests' footer (no 'Out of bounds values' line): the run "
                           "did not finish")
    out["rows"] = rows
    if not rows:
        first = next((ln.strip() for ln in (text or "").splitlines() if ln.strip() and not ln.startswith("#")), "")
        reasons.append("not a result document: no result rows" + (f" ({first[:300]})" if first else ""))
        return out
    for r in rows:
        wrong = [w for w in r["wrong"] if _number(w) != 0.0]  # "N/A" (checking off) was left out above
        if wrong:
            reasons.append(f"{r['size']} bytes: #wrong {', '.join(str(w) for w in wrong)}")
    largest = max(rows, key=lambda r: r["size"])
    values = [v for v in (largest["oop_busbw"], largest["ip_busbw"]) if v is not None]
    out["message_bytes"] = largest["size"]
    if not values:
        reasons.append(f"{largest['size']} bytes: no bus bandwidth figure")
    else:
        out["busbw_gbps"] = min(values)
        if min_busbw is not None and out["busbw_gbps"] < min_busbw:
            reasons.append(f"busbw {out['busbw_gbps']:g} GB/s at {largest['size']} bytes is below the threshold "
                           f"{min_busbw:g} GB/s (out-of-place {largest['oop_busbw']}, in-place {largest['ip_busbw']})")
    out["verdict"] = _verdict(reasons)
    return out


_NVLINK_GPU = re.compile(r"^GPU (\d+):")
_NVLINK_LINK = re.compile(r"^\s*Link (\d+):\s*(.*)$")


def parse_nvlink(text: str, exit_code: int | None = None, expected_gpus: int = 0) -> dict:
    """`nvidia-smi nvlink --status`: every link of every GPU must be up (a speed such as `26.562 GB/s`); an
    `<inactive>` link, a GPU without links where others have them, or fewer GPUs than expected fail."""
    gpus: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        found = _NVLINK_GPU.match(line)
        if found:
            current = gpus.setdefault(found.group(1), {"status": "pass", "links": 0, "inactive": []})
            continue
        link = _NVLINK_LINK.match(line)
        if link and current is not None:
            current["links"] += 1
            if "GB/s" not in link.group(2):
                current["inactive"].append(int(link.group(1)))
                current["status"] = "fail"
    reasons = []
    if exit_code not in (0, None):
        reasons.append(f"nvidia-smi nvlink exited {exit_code}")
    if not gpus:
        reasons.append("no GPU listed by nvidia-smi nvlink --status")
    elif expected_gpus and len(gpus) < expected_gpus:
        reasons.append(f"{len(gpus)} of {expected_gpus} GPUs listed")
    most = max((g["links"] for g in gpus.values()), default=0)
    for index, gpu in gpus.items():
        if gpu["inactive"]:
            reasons.append(f"GPU {index}: {len(gpu['inactive'])} of {gpu['links']} NVLinks inactive")
        elif gpu["links"] < most:
            gpu["status"] = "fail"
            reasons.append(f"GPU {index}: {gpu['links']} NVLinks, others have {most}")
    return {"verdict": _verdict(reasons), "reasons": reasons, "gpus": gpus}
