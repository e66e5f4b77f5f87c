"""GPU commands: `gpu_reset` (nvidia-smi --gpu-reset per GPU, refused while a process holds one) and
`health_check` (run `dcgmi diag -r N -j` or `all_reduce_perf` and report raw output and exit code; the
console parses and judges, so a parser fix never needs a new ramdisk)."""
from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import tempfile
import time

from agent.commands.base import CommandError, Context

MAX_OUTPUT = 512 * 1024
# nvidia-smi's documented return codes.
SMI_CODES = {0: "success", 2: "invalid argument", 3: "operation not supported on this GPU", 4: "no permission",
             6: "the query was unsuccessful", 9: "NVIDIA driver not loaded", 12: "NVML shared library not found",
             15: "the GPU has fallen off the bus", 255: "other error"}
# How long each DCGM level may take (NVIDIA: r1 seconds, r2 ~2 min, r3 ~15 min, r4 up to hours).
DCGM_TIMEOUT_S = {1: 300, 2: 900, 3: 3600, 4: 4 * 3600}


def _run(argv: list[str], timeout: float, env: dict | None = None) -> dict:
    started = time.monotonic()
    exe = shutil.which(argv[0], path=(env or os.environ).get("PATH"))
    if exe is None:
        return {"command": " ".join(argv), "exit_code": 127, "stdout": "", "stderr": f"{argv[0]}: command not found",
                "duration_s": 0.0}
    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout, env=env)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = 124
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = f"{argv[0]}: killed after {int(timeout)}s"
    return {"command": " ".join(argv), "exit_code": code, "stdout": out[-MAX_OUTPUT:], "stderr": err[-MAX_OUTPUT:],
            "duration_s": round(time.monotonic() - started, 3)}


def _csv(text: str) -> list[list[str]]:
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(text), skipinitialspace=True)
            if row and row[0].strip()]


def list_gpus(env: dict | None = None) -> tuple[list[dict], dict]:
    run = _run(["nvidia-smi", "--query-gpu=index,pci.bus_id,uuid,name", "--format=csv,noheader"], 60, env)
    if run["exit_code"] != 0:
        return [], run
    gpus = [{"index": int(r[0]), "pci_bus": r[1], "uuid": r[2], "name": r[3] if len(r) > 3 else ""}
            for r in _csv(run["stdout"]) if r[0].isdigit()]
    return gpus, run


def gpu_processes(env: dict | None = None) -> tuple[list[dict], dict]:
    run = _run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                "--format=csv,noheader"], 60, env)
    apps = [{"gpu_uuid": r[0], "pid": r[1], "process_name": r[2], "used_memory": r[3] if len(r) > 3 else ""}
            for r in _csv(run["stdout"]) if len(r) >= 3 and r[0].startswith("GPU-")] if run["exit_code"] == 0 else []
    return apps, run


def gpu_reset(args: dict, ctx: Context) -> dict:
    """Reset every GPU, one at a time (`nvidia-smi --gpu-reset -i N`). Refuses, with the reason, when a
    process holds a GPU: resetting under a running process is what nvidia-smi itself forbids."""
    expected = int(args.get("expected_gpus") or 0)
    env = ctx.hardware.tool_env()
    if shutil.which("nvidia-smi", path=(env or os.environ).get("PATH")) is None:
        if expected:
            raise CommandError(f"nvidia-smi not found: {expected} GPU(s) expected, none can be reset or checked",
                               {"gpus": [], "expected": expected})
        return {"gpus": [], "skipped": "no nvidia-smi and no GPU expected"}
    gpus, listing = list_gpus(env)
    log = [listing]
    facts = {"expected": expected, "gpus": gpus, "runs": log}
    if listing["exit_code"] != 0:
        raise CommandError(f"nvidia-smi exited {listing['exit_code']} "
                           f"({SMI_CODES.get(listing['exit_code'], 'unknown')}): "
                           f"{(listing['stderr'] or listing['stdout']).strip()[-300:]}", facts)
    if len(gpus) < expected:
        raise CommandError(f"nvidia-smi lists {len(gpus)} GPU(s); {expected} expected", facts)
    apps, query = gpu_processes(env)
    log.append(query)
    if apps:
        by_uuid = {g["uuid"]: g for g in gpus}
        held = [f"GPU {by_uuid.get(a['gpu_uuid'], {}).get('index', '?')} ({a['gpu_uuid']}) is held by pid {a['pid']} "
                f"({a['process_name']}, {a['used_memory']})" for a in apps]
        raise CommandError("refusing to reset the GPUs: " + "; ".join(held), {**facts, "processes": apps})
    done = []
    for gpu in gpus:
        ctx.progress(int(100 * len(done) / max(1, len(gpus))), f"resetting GPU {gpu['index']}")
        run = _run(["nvidia-smi", "--gpu-reset", "-i", str(gpu["index"])], 300, env)
        log.append(run)
        ok = run["exit_code"] == 0
        done.append({**gpu, "reset": "ok" if ok else SMI_CODES.get(run["exit_code"], f"exit {run['exit_code']}"),
                     "exit_code": run["exit_code"], "output": (run["stdout"] + run["stderr"]).strip()[-1000:]})
    failed = [g for g in done if g["exit_code"] != 0]
    facts = {**facts, "gpus": done}
    if failed:
        raise CommandError("GPU reset failed: " + "; ".join(f"GPU {g['index']}: exit {g['exit_code']} ({g['reset']}): "
                                                            f"{g['output'][-200:]}" for g in failed), facts)
    return facts


def health_check(args: dict, ctx: Context) -> dict:
    """One suite: `dcgm` (`dcgmi diag -r LEVEL -j`), `nccl` (`all_reduce_perf` over every GPU, -J JSON) or
    `links` (`nvidia-smi nvlink --status`) or `burnin` (`dcgmi diag -r LEVEL` repeated for `seconds`)."""
    suite = args.get("suite")
    env = ctx.hardware.tool_env()
    if suite == "dcgm":
        level = int(args.get("level", 2))
        if level not in DCGM_TIMEOUT_S:
            raise CommandError("health_check: DCGM level must be 1 to 4")
        ctx.progress(None, f"dcgmi diag -r {level}")
        run = _run(["dcgmi", "diag", "-r", str(level), "-j"], float(args.get("timeout_s") or DCGM_TIMEOUT_S[level]),
                   env)
        return {"suite": "dcgm", "level": level, **run}
    if suite == "nccl":
        gpus = int(args.get("gpus") or 0) or len(list_gpus(env)[0])
        if gpus <= 0:
            raise CommandError("health_check: no GPU for all_reduce_perf")
        report = os.path.join(ctx.tmp_dir or tempfile.gettempdir(), f"vmetal-nccl-{os.getpid()}-{time.time_ns()}.json")
        argv = ["all_reduce_perf", "-b", str(args.get("min_bytes", "1G")), "-e", str(args.get("max_bytes", "8G")),
                "-f", "2", "-g", str(gpus)]
        if args.get("json", True):
            argv += ["-J", report]
        ctx.progress(None, " ".join(argv))
        run = _run(argv, float(args.get("timeout_s") or 1800), env)
        json_text = None
        try:
            with open(report) as f:
                json_text = f.read()[-MAX_OUTPUT:]
            os.unlink(report)
        except OSError:
            pass
        return {"suite": "nccl", "gpus": gpus, "json": json_text, **run}
    if suite == "burnin":
        # `dcgmi diag -r LEVEL` again and again for `seconds` (at least once), stopping at the first failure; the
        # console judges the last run's output.
        level = int(args.get("level", 3))
        seconds = float(args.get("seconds") or 0)
        started, passes, run = time.monotonic(), 0, None
        while run is None or (run["exit_code"] == 0 and time.monotonic() - started < seconds):
            ctx.progress(None, f"burn-in: dcgmi diag -r {level}, pass {passes + 1}")
            run = _run(["dcgmi", "diag", "-r", str(level), "-j"], DCGM_TIMEOUT_S.get(level, 3600), env)
            passes += 1
        return {"suite": "burnin", "level": level, "passes": passes,
                "seconds": round(time.monotonic() - started, 3), **run}
    if suite == "links":
        ctx.progress(None, "nvidia-smi nvlink --status")
        run = _run(["nvidia-smi", "nvlink", "--status"], float(args.get("timeout_s") or 60), env)
        return {"suite": "links", **run}
    raise CommandError(f"health_check: unknown suite {suite!r} (dcgm, nccl or links)")


# --- gpu_state: every GPU back to the state its NodeType hands it over in ------------------------------------
# The agent runs the commands and reports what it read before and after, raw; the console parses and judges
# (hosts/gate/gpu_state.py): it never takes the agent's word that a GPU is in its default state.

STATE_QUERY = ("index,pci.bus_id,uuid,name,mig.mode.current,mig.mode.pending,persistence_mode,"
               "clocks.applications.graphics,clocks.default_applications.graphics,clocks.applications.memory,"
               "clocks.default_applications.memory,power.limit,power.default_limit,"
               "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,"
               "ecc.errors.uncorrected.aggregate.total,retired_pages.sbe,retired_pages.dbe,retired_pages.pending")
REMAP_QUERY = ("gpu_bus_id,gpu_uuid,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,"
               "remapped_rows.failure")
NOT_FOUND = 6  # nvidia-smi mig -dci / -dgi / -lgi with nothing to destroy or list: "Not Found"
NOT_SUPPORTED = 3  # e.g. -rmc on a GPU without locked memory clocks


def _read_state(env: dict | None) -> dict:
    """What the GPUs say now: the --query-gpu CSV, the remapped rows and each GPU's MIG GPU instances."""
    query = _run(["nvidia-smi", f"--query-gpu={STATE_QUERY}", "--format=csv,noheader,nounits"], 60, env)
    remap = _run(["nvidia-smi", f"--query-remapped-rows={REMAP_QUERY}", "--format=csv,noheader"], 60, env)
    instances = {}
    for row in _csv(query["stdout"]) if query["exit_code"] == 0 else []:
        if row and row[0].isdigit() and len(row) > 5 and "Enabled" in (row[4], row[5]):
            instances[row[0]] = _run(["nvidia-smi", "mig", "-lgi", "-i", row[0]], 60, env)
    return {"query": query, "remapped": remap, "instances": instances}


def _rows(state: dict) -> list[dict]:
    fields = STATE_QUERY.split(",")
    return [dict(zip(fields, row)) for row in _csv(state["query"]["stdout"]) if row and row[0].isdigit()]


def gpu_state(args: dict, ctx: Context) -> dict:
    """Bring every GPU to the NodeType's state: MIG instances destroyed, MIG mode as declared (a GPU whose new
    mode is pending is reset), the declared GPU instances created (with their default compute instances), application
    and locked clocks reset, the power limit back at its default, persistence mode as declared; then read it all
    back. Fails, with the facts, when a command fails; the console judges the state read back either way."""
    expected = int(args.get("expected_gpus") or 0)
    layout = [str(p) for p in args.get("mig_layout") or []]
    persistence = bool(args.get("persistence_mode", True))
    env = ctx.hardware.tool_env()
    if shutil.which("nvidia-smi", path=(env or os.environ).get("PATH")) is None:
        if expected:
            raise CommandError(f"nvidia-smi not found: {expected} GPU(s) expected, none can be reset or checked",
                               {"expected": expected})
        return {"skipped": "no nvidia-smi and no GPU expected"}
    before = _read_state(env)
    facts = {"expected": expected, "mig_layout": layout, "persistence_mode": persistence, "before": before,
             "actions": [], "after": None}
    if before["query"]["exit_code"] != 0:
        code = before["query"]["exit_code"]
        raise CommandError(f"nvidia-smi exited {code} ({SMI_CODES.get(code, 'unknown')}): "
                           f"{(before['query']['stderr'] or before['query']['stdout']).strip()[-300:]}", facts)
    errors = []

    def act(argv: list[str], tolerated: tuple[int, ...] = ()) -> dict:
        run = _run(argv, 300, env)
        facts["actions"].append(run)
        if run["exit_code"] not in (0, *tolerated):
            said = next((ln.strip() for ln in (run["stderr"] + "\n" + run["stdout"]).splitlines() if ln.strip()), "")
            errors.append(f"{' '.join(argv)}: exit {run['exit_code']} "
                          f"({SMI_CODES.get(run['exit_code'], 'unknown')}): {said[:300]}")
        return run

    rows = _rows(before)
    for n, gpu in enumerate(rows):
        i = gpu["index"]
        ctx.progress(int(100 * n / max(1, len(rows))), f"GPU {i}: back to its default state")
        mig_on = "Enabled" in (gpu.get("mig.mode.current"), gpu.get("mig.mode.pending"))
        if mig_on:  # compute instances first: a GPU instance with one in it cannot be destroyed
            act(["nvidia-smi", "mig", "-dci", "-i", i], (NOT_FOUND,))
            act(["nvidia-smi", "mig", "-dgi", "-i", i], (NOT_FOUND,))
        want = "Enabled" if layout else "Disabled"
        if gpu.get("mig.mode.current") != want or gpu.get("mig.mode.pending") != want:
            if gpu.get("mig.mode.current") not in ("[N/A]", "N/A", None) or layout:
                run = act(["nvidia-smi", "-i", i, "-mig", "1" if layout else "0"])
                if run["exit_code"] == 0:
                    mode = _run(["nvidia-smi", "-i", i, "--query-gpu=mig.mode.current,mig.mode.pending",
                                 "--format=csv,noheader"], 60, env)
                    modes = (_csv(mode["stdout"]) or [[]])[0]
                    if len(modes) == 2 and modes[0] != modes[1]:  # A100: the new mode takes a GPU reset
                        act(["nvidia-smi", "--gpu-reset", "-i", i])
        if layout:
            act(["nvidia-smi", "mig", "-i", i, "-cgi", ",".join(layout), "-C"])
        act(["nvidia-smi", "-i", i, "-rac"], (NOT_SUPPORTED,))
        act(["nvidia-smi", "-i", i, "-rgc"], (NOT_SUPPORTED,))
        act(["nvidia-smi", "-i", i, "-rmc"], (NOT_SUPPORTED,))
        default_limit = gpu.get("power.default_limit", "")
        if default_limit and default_limit[0].isdigit() and gpu.get("power.limit") != default_limit:
            act(["nvidia-smi", "-i", i, "-pl", default_limit], (NOT_SUPPORTED,))
        act(["nvidia-smi", "-i", i, "-pm", "1" if persistence else "0"])
    ctx.progress(100, "reading the GPUs' state back")
    facts["after"] = _read_state(env)
    if len(rows) < expected:
        errors.insert(0, f"nvidia-smi lists {len(rows)} GPU(s); {expected} expected")
    if errors:
        raise CommandError("GPU state reset failed: " + "; ".join(errors[:4]), {**facts, "errors": errors})
    return facts
