"""The lab's fake hardware tools: `nvidia-smi`, `dcgmi`, `all_reduce_perf`, `nvme` and `hdparm`, printing the
real tools' formats, acting on the lab server described by $VMETAL_LAB_PROFILE (its GPUs, its disk files).

The lab puts a directory of small shims on the agent's PATH (`python -m lab.fake_tools TOOL ARGS`), so the
agent runs the same commands it runs on real hardware. Faults come from the profile's "lab" section:
    {"faults": [{"kind": "gpu-dcgm-fail", "gpu": 3}, {"kind": "nccl-slow"}, ...], "dcgm_version": "3.3.9"}
GPU faults: gpu-dcgm-fail (DCGM's memory test finds faulty memory: Fail, exit 205), gpu-xid (an XID 48 on the
GPU during the diagnostic: Fail, exit 226), gpu-reset-busy (a process holds the GPU: listed by
--query-compute-apps, reset refused with exit 255), nccl-slow (large-message busbw well under 400 GB/s),
nvlink-slow (GPU N's NVLinks partly down: `nvidia-smi nvlink --status` shows them inactive, busbw ~330 GB/s),
xid-intermittent (an XID 94 on GPU N in the first `dcgmi diag` of level 2 or more only: xid-intermittent.fired
beside the profile records that it showed), burnin-fail (Targeted Stress fails on GPU N at `dcgmi diag -r 3`
or 4 with DCGM_FR_STRESS_LEVEL; levels 1 and 2 pass), mig-busy (GPU N's MIG mode cannot be changed: "In use by
another client"), ecc-uncorrectable (GPU N: 2 volatile uncorrectable ECC errors, a row remap pending). The GPUs'
settings (MIG mode and instances, clocks, power limit, persistence mode) are kept in gpu-state.json beside the
profile, so that nvidia-smi answers the same across calls and a test can play a tenant that changed them. A missing GPU (the lab's gpu-missing) is simply absent
from the profile's list.
Disk faults (the disk's "fault"): erase-skips-region (the erase reports success, the middle quarter of the
disk is left untouched), erase-fails (the erase command fails).
ATA drives (a disk that is not "nvme"): "enhanced_erase": false for a drive with only the normal SECURITY ERASE
UNIT (it refuses the enhanced one); "frozen": true for a drive the firmware froze at boot, which a suspend to RAM
(`rtcwake -m mem`) unfreezes, or "frozen": "always" for one frozen again on resume. The fake `rtcwake` never
suspends anything: it records the call (rtcwake.log beside the profile) and thaws the drives that would thaw.

Formats: nvidia-smi's CSV queries and --gpu-reset messages (tests/fixtures/health/nvidia-smi-gpu-reset.txt);
dcgmi diag -j as DCGM 3.x ("DCGM GPU Diagnostic", Title Case tests, gpu_id) or 4.x ("DCGM Diagnostic",
lower-case tests, entity_id, test_summary, entity_groups, metadata), error texts from DCGM's dcgm_errors.h;
all_reduce_perf's table and -J report as NVIDIA/nccl-tests src/util.cu writes them."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# rtcwake too: a lab agent must never reach the real one (it would suspend the machine running the lab).
TOOLS = ("nvidia-smi", "dcgmi", "all_reduce_perf", "nvme", "hdparm", "rtcwake")
MiB = 1024 * 1024


def profile() -> dict:
    path = os.environ.get("VMETAL_LAB_PROFILE")
    if not path:
        sys.stderr.write("lab tool: VMETAL_LAB_PROFILE is not set\n")
        sys.exit(9)
    return json.loads(Path(path).read_text())


def faults(prof: dict, kind: str) -> list[dict]:
    return [f for f in (prof.get("lab") or {}).get("faults", []) if f.get("kind") == kind]


def faulty_gpus(prof: dict, kind: str) -> set[int]:
    return {int(f.get("gpu", 0)) for f in faults(prof, kind)}


# --- nvidia-smi -----------------------------------------------------------------------------------

SMI_FIELDS = {"index": lambda g, u: str(g["index"]), "name": lambda g, u: g["name"], "uuid": lambda g, u: g["uuid"],
              "memory.total": lambda g, u: f"{g['memory_mib']}" + ("" if u else " MiB"),
              "pci.bus_id": lambda g, u: g["pci_bus"], "vbios_version": lambda g, u: g.get("vbios_version", "[N/A]")}
NVLINKS = 18  # an H100/H200 SXM GPU has 18 NVLink 4 links of 26.562 GB/s


# --- the GPUs' settings, kept per server across calls (gpu-state.json beside the profile) -------------------
# What a tenant may change and the release gate resets: MIG mode and instances, application and locked clocks,
# the power limit, persistence mode. ECC counts come from the profile's faults (ecc-uncorrectable). A test plays
# the tenant with lab.site.LabSite.set_gpu_state; mig-busy (GPU N) refuses every MIG mode change: "In use by
# another client", as while a process holds the GPU.
GPU_DEFAULTS = {"mig_current": "Disabled", "mig_pending": "Disabled", "instances": [], "persistence": "Enabled",
                "app_graphics": 1980, "app_memory": 3201, "locked_graphics": None, "power_limit": 700.0}
DEFAULT_CLOCKS = (1980, 3201)
DEFAULT_POWER_LIMIT = 700.0
# Profile name → the ID nvidia-smi mig -lgip prints for an H200 (141 GB).
MIG_PROFILE_IDS = {"1g.18gb": 19, "1g.18gb+me": 20, "1g.35gb": 15, "2g.35gb": 14, "3g.71gb": 9, "4g.71gb": 5,
                   "7g.141gb": 0}


def _gpu_state_path() -> Path:
    return Path(os.environ["VMETAL_LAB_PROFILE"]).with_name("gpu-state.json")


def gpu_states(prof: dict) -> dict[str, dict]:
    path = _gpu_state_path()
    kept = json.loads(path.read_text()) if path.exists() else {}
    return {str(g["index"]): {**GPU_DEFAULTS, **kept.get(str(g["index"]), {})} for g in prof.get("gpus") or []}


def _save_gpu_states(states: dict) -> None:
    _gpu_state_path().write_text(json.dumps(states, indent=1))


def _state_field(field: str, g: dict, st: dict, prof: dict, nounits: bool) -> str:
    mhz, watts = ("", "") if nounits else (" MHz", " W")
    ecc = g["index"] in faulty_gpus(prof, "ecc-uncorrectable")
    values = {
        "mig.mode.current": st["mig_current"], "mig.mode.pending": st["mig_pending"],
        "persistence_mode": st["persistence"],
        "clocks.applications.graphics": f"{st['app_graphics']}{mhz}",
        "clocks.default_applications.graphics": f"{DEFAULT_CLOCKS[0]}{mhz}",
        "clocks.applications.memory": f"{st['app_memory']}{mhz}",
        "clocks.default_applications.memory": f"{DEFAULT_CLOCKS[1]}{mhz}",
        "power.limit": f"{st['power_limit']:.2f}{watts}", "power.default_limit": f"{DEFAULT_POWER_LIMIT:.2f}{watts}",
        "ecc.errors.corrected.volatile.total": "3" if ecc else "0",
        "ecc.errors.uncorrected.volatile.total": "2" if ecc else "0",
        "ecc.errors.uncorrected.aggregate.total": "2" if ecc else "0",
        # Hopper remaps rows instead of retiring pages: nvidia-smi prints [N/A] for these.
        "retired_pages.sbe": "[N/A]", "retired_pages.dbe": "[N/A]", "retired_pages.pending": "[N/A]",
    }
    return values.get(field, "[N/A]")


def _chosen(args: list[str], gpus: list[dict]) -> list[dict] | None:
    """The GPUs `-i N` names (all without -i); None, said as nvidia-smi says it, when none matches."""
    target = args[args.index("-i") + 1] if "-i" in args else None
    chosen = [g for g in gpus if target is None or str(g["index"]) == target]
    if not chosen:
        print(f"No devices were found matching {target}", file=sys.stderr)
        return None
    return chosen


def _mig(args: list[str], prof: dict, gpus: list[dict]) -> int:
    """nvidia-smi mig -lgi / -dci / -dgi / -cgi LIST [-C], each with -i N, as an H200 prints them."""
    chosen = _chosen(args, gpus)
    if chosen is None:
        return 6
    states = gpu_states(prof)
    for g in chosen:
        st = states[str(g["index"])]
        if st["mig_current"] != "Enabled":
            print(f"Unable to manage MIG on GPU {g['index']}: MIG mode is not enabled (Insufficient Permissions?)"
                  if "-cgi" in args else "No GPU instances found: Not Found", file=sys.stderr)
            return 6 if "-cgi" not in args else 3
    if "-lgi" in args:
        rows = [(g, n, p) for g in chosen for n, p in enumerate(states[str(g["index"])]["instances"])]
        if not rows:
            print("No GPU instances found: Not Found", file=sys.stderr)
            return 6
        print("+-------------------------------------------------------+\n| GPU instances:                      "
              "                  |\n| GPU   Name             Profile  Instance   Placement  |\n|                  "
              "        ID       ID       Start:Size |\n|=======================================================|")
        for g, n, p in rows:
            size = int(p.split("g", 1)[0])
            print(f"|  {g['index']:>2}  MIG {p:<14} {MIG_PROFILE_IDS.get(p, 0):>4} {n + 1:>8}  {n:>9}:{size:<6}|")
        print("+-------------------------------------------------------+")
        return 0
    if "-dci" in args or "-dgi" in args:
        found = False
        for g in chosen:
            st = states[str(g["index"])]
            for n, _ in enumerate(st["instances"]):
                found = True
                if "-dci" in args:
                    print(f"Successfully destroyed compute instance ID  0 from GPU {g['index']:>2} GPU instance ID "
                          f"{n + 1:>2}")
                else:
                    print(f"Successfully destroyed GPU instance ID {n + 1:>2} from GPU {g['index']:>2}")
            if "-dgi" in args:
                st["instances"] = []
        _save_gpu_states(states)
        if not found:
            print(f"No {'compute' if '-dci' in args else 'GPU'} instances found: Not Found", file=sys.stderr)
            return 6
        return 0
    if "-cgi" in args:
        wanted = args[args.index("-cgi") + 1].split(",")
        unknown = [p for p in wanted if p not in MIG_PROFILE_IDS and not (p.isdigit() and int(p) in
                                                                          MIG_PROFILE_IDS.values())]
        if unknown:
            print(f"Unable to create a GPU instance on GPU {chosen[0]['index']} using profile {unknown[0]}: "
                  "Invalid Argument", file=sys.stderr)
            return 2
        for g in chosen:
            st = states[str(g["index"])]
            names = {v: k for k, v in MIG_PROFILE_IDS.items()}
            for p in wanted:
                name = names[int(p)] if p.isdigit() else p
                if sum(int(q.split("g", 1)[0]) for q in st["instances"]) + int(name.split("g", 1)[0]) > 7:
                    print(f"Unable to create a GPU instance on GPU {g['index']} using profile {name}: "
                          "Insufficient Resources", file=sys.stderr)
                    _save_gpu_states(states)
                    return 2
                st["instances"].append(name)
                n = len(st["instances"])
                print(f"Successfully created GPU instance ID {n:>2} on GPU {g['index']:>2} using profile MIG {name} "
                      f"(ID {MIG_PROFILE_IDS[name]:>2})")
                if "-C" in args:
                    print(f"Successfully created compute instance ID  0 on GPU {g['index']:>2} GPU instance ID "
                          f"{n:>2} using profile MIG {name} (ID {MIG_PROFILE_IDS[name]:>2})")
        _save_gpu_states(states)
        return 0
    print("nvidia-smi mig: option not simulated in the lab", file=sys.stderr)
    return 2


def _settings(args: list[str], prof: dict, gpus: list[dict]) -> int | None:
    """-mig 0|1, -rac, -rgc, -rmc, -pl W, -pm 0|1 (with -i N); None when `args` asks none of them."""
    flags = ("-mig", "-rac", "-rgc", "-rmc", "-pl", "-pm")
    if not any(f in args for f in flags):
        return None
    chosen = _chosen(args, gpus)
    if chosen is None:
        return 6
    states = gpu_states(prof)
    busy = faulty_gpus(prof, "mig-busy")
    code = 0
    for g in chosen:
        st, bus = states[str(g["index"])], g["pci_bus"]
        if "-mig" in args:
            on = args[args.index("-mig") + 1] == "1"
            word = "Enabled" if on else "Disabled"
            if g["index"] in busy and st["mig_current"] != word:
                print(f"Unable to {'enable' if on else 'disable'} MIG Mode for GPU {bus}: In use by another client\n"
                      f"{bus} is currently being used by one or more other processes (e.g. CUDA application or a "
                      "monitoring application such as another instance of nvidia-smi). Please first kill all "
                      "processes using the device and retry the command or reboot the system to make MIG mode "
                      "effective.", file=sys.stderr)
                code = 255
                continue
            if not on and st["instances"]:
                print(f"Unable to disable MIG Mode for GPU {bus}: In use by another client (GPU instances exist)",
                      file=sys.stderr)
                code = 255
                continue
            st.update(mig_current=word, mig_pending=word)
            print(f"{'Enabled' if on else 'Disabled'} MIG Mode for GPU {bus}.")
        if "-rac" in args:
            st.update(app_graphics=DEFAULT_CLOCKS[0], app_memory=DEFAULT_CLOCKS[1])
        if "-rgc" in args:
            st["locked_graphics"] = None
            print(f"GPU clocks reset to default for GPU {bus}.")
        if "-rmc" in args:
            print(f"Memory clocks reset to default for GPU {bus}.")
        if "-pl" in args:
            was, st["power_limit"] = st["power_limit"], float(args[args.index("-pl") + 1])
            print(f"Power limit for GPU {bus} was set to {st['power_limit']:.2f} W from {was:.2f} W.")
        if "-pm" in args:
            on = args[args.index("-pm") + 1] == "1"
            st["persistence"] = "Enabled" if on else "Disabled"
            print(f"{'Enabled' if on else 'Disabled'} persistence mode for GPU {bus}.")
    _save_gpu_states(states)
    if code == 0 and ("-mig" in args or "-rac" in args):
        print("All done.")
    return code


def nvidia_smi(args: list[str]) -> int:
    prof = profile()
    gpus = prof.get("gpus") or []
    query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "csv")
    nounits = "nounits" in fmt
    if query:
        fields = query.split(",")
        if "noheader" not in fmt:
            print(", ".join(fields))
        states = gpu_states(prof)
        target = args[args.index("-i") + 1] if "-i" in args else None
        for g in gpus:
            if target is not None and str(g["index"]) != target:
                continue
            st = states[str(g["index"])]
            print(", ".join(SMI_FIELDS[f](g, nounits) if f in SMI_FIELDS else _state_field(f, g, st, prof, nounits)
                            for f in fields))
        return 0
    remap = next((a.split("=", 1)[1] for a in args if a.startswith("--query-remapped-rows=")), None)
    if remap:
        fields = remap.split(",")
        if "noheader" not in fmt:
            print(", ".join(fields))
        for g in gpus:
            ecc = g["index"] in faulty_gpus(prof, "ecc-uncorrectable")
            row = {"gpu_bus_id": g["pci_bus"], "gpu_uuid": g["uuid"], "remapped_rows.correctable": "0",
                   "remapped_rows.uncorrectable": "1" if ecc else "0", "remapped_rows.pending": "Yes" if ecc else "No",
                   "remapped_rows.failure": "No"}
            print(", ".join(row.get(f, "[N/A]") for f in fields))
        return 0
    if args[:1] == ["mig"]:
        return _mig(args[1:], prof, gpus)
    changed = _settings(args, prof, gpus)
    if changed is not None:
        return changed
    apps = next((a.split("=", 1)[1] for a in args if a.startswith("--query-compute-apps=")), None)
    if apps:
        fields = apps.split(",")
        if "noheader" not in fmt:
            print(", ".join(fields))
        for g in gpus:
            if g["index"] in faulty_gpus(prof, "gpu-reset-busy"):
                row = {"gpu_uuid": g["uuid"], "pid": "4242", "process_name": "/usr/bin/python3",
                       "used_memory": "1024 MiB", "gpu_bus_id": g["pci_bus"]}
                print(", ".join(row.get(f, "[N/A]") for f in fields))
        return 0
    if args[:1] == ["nvlink"] and ("--status" in args or "-s" in args):
        slow = faulty_gpus(prof, "nvlink-slow")
        target = args[args.index("-i") + 1] if "-i" in args else None
        for g in gpus:
            if target is not None and str(g["index"]) != target:
                continue
            print(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
            for link in range(NVLINKS):
                down = g["index"] in slow and link >= NVLINKS // 3 * 2  # a third of its links inactive
                print(f"\t Link {link}: " + ("<inactive>" if down else "26.562 GB/s"))
        return 0
    if "--gpu-reset" in args or "-r" in args:
        chosen = _chosen(args, gpus)
        if chosen is None:
            return 6
        busy = [g for g in chosen if g["index"] in faulty_gpus(prof, "gpu-reset-busy")]
        if busy:
            print("The following GPUs could not be reset:")
            for g in busy:
                print(f"  GPU {g['pci_bus']}: In use by another client")
            print(f"\n{len(busy)} device{'s are' if len(busy) > 1 else ' is'} currently being used by one or more "
                  "other processes (e.g., Fabric Manager, CUDA application, graphics application such as an X server, "
                  "or a monitoring application such as another instance of nvidia-smi). Please first kill all "
                  "processes using this device and all compute applications running in the system.")
            return 255
        for g in chosen:
            print(f"GPU {g['pci_bus']} was successfully reset.")
        return 0
    print("NVIDIA-SMI 570.124.06   Driver Version: 570.124.06   CUDA Version: 12.8")
    return 0


# --- dcgmi diag -------------------------------------------------------------------------------------

DEPLOYMENT_3X = ["Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks", "Persistence Mode",
                 "Environment Variables", "Page Retirement/Row Remap", "Graphics Processes", "Inforom"]


def _xid_fired_path() -> Path:
    return Path(os.environ["VMETAL_LAB_PROFILE"]).with_name("xid-intermittent.fired")


def _failures(prof: dict, level: int = 2) -> dict[tuple[str, int], dict]:
    """(test, gpu) → the warning DCGM would print, with its dcgmError_t id, category and severity."""
    out = {}
    if level >= 2 and not _xid_fired_path().exists():
        for gpu in faulty_gpus(prof, "xid-intermittent"):
            out[("pcie", gpu)] = {"warning": f"Detected XID 94 for GPU {gpu}", "error_id": 101,
                                  "error_category": 5, "error_severity": 4}  # a contained ECC error: once
    if level >= 3:
        for gpu in faulty_gpus(prof, "burnin-fail"):
            out[("targeted_stress", gpu)] = {
                "warning": f"Max stress level of 6124.8 did not reach desired stress level of 8230.0 for GPU {gpu}",
                "error_id": 50, "error_category": 1, "error_severity": 4}  # DCGM_FR_STRESS_LEVEL, TRIAGE
    for gpu in faulty_gpus(prof, "gpu-dcgm-fail"):
        out[("memory", gpu)] = {"warning": f"Found 12 faulty memory elements on GPU {gpu}", "error_id": 52,
                                "error_category": 10, "error_severity": 2}  # DCGM_FR_FAULTY_MEMORY, ISOLATE
    for gpu in faulty_gpus(prof, "gpu-xid"):
        out[("pcie", gpu)] = {"warning": f"Detected XID 48 for GPU {gpu}", "error_id": 101,
                              "error_category": 5, "error_severity": 4}  # DCGM_FR_XID_ERROR, TRIAGE
    return out


def dcgmi(args: list[str]) -> int:
    if not args or args[0] != "diag":
        print("Usage: dcgmi diag -r <level> [-j]", file=sys.stderr)
        return 2
    prof = profile()
    level = int(args[args.index("-r") + 1]) if "-r" in args else 1
    version = (prof.get("lab") or {}).get("dcgm_version", "3.3.9")
    gpus = [g["index"] for g in prof.get("gpus") or []]
    failures = _failures(prof, level)
    if faults(prof, "xid-intermittent") and level >= 2:
        _xid_fired_path().touch()  # shown once (or never, when this run has no PCIe test): a retest passes
    tests = [("Integration", "pcie", "PCIe"), ("Hardware", "memory", "GPU Memory")] if level >= 2 else []
    if level >= 3:
        tests += [("Hardware", "diagnostic", "Diagnostic"), ("Stress", "targeted_stress", "Targeted Stress"),
                  ("Stress", "targeted_power", "Targeted Power"), ("Stress", "memory_bandwidth", "Memory Bandwidth")]
    doc = _dcgm4(version, gpus, tests, failures) if version.startswith("4") else _dcgm3(version, gpus, tests, failures)
    if "-j" in args or "--json" in args:
        print(json.dumps(doc, indent=4))
    else:
        print("Successfully ran diagnostic for group.")
    if any(f["error_severity"] == 2 for f in failures.values()):
        return 205  # DCGM_ST_NVVS_ISOLATE_ERROR
    return 226 if failures else 0  # DCGM_ST_NVVS_ERROR


def _dcgm3(version, gpus, tests, failures) -> dict:
    categories = [{"category": "Deployment", "tests": [{"name": n, "results": [{"status": "Pass"}]}
                                                       for n in DEPLOYMENT_3X]}]
    for category, key, title in tests:
        results = []
        for gpu in gpus:
            failure = failures.get((key, gpu))
            result = {"gpu_id": str(gpu), "status": "Fail" if failure else "Pass"}
            if failure:
                result["warnings"] = [{"warning": failure["warning"], "error_id": failure["error_id"],
                                       "error_category": failure["error_category"],
                                       "error_severity": failure["error_severity"]}]
            elif key == "memory":
                result["info"] = f"GPU {gpu} Allocated 146891399577 bytes (97.4%)"
            results.append(result)
        block = next((c for c in categories if c["category"] == category), None)
        if block is None:
            block = {"category": category, "tests": []}
            categories.append(block)
        block["tests"].append({"name": title, "results": results})
    return {"DCGM GPU Diagnostic": {"test_categories": categories, "version": version}}


def _dcgm4(version, gpus, tests, failures) -> dict:
    def entity(gpu, status, extra=None):
        return {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": status, **(extra or {})}

    categories = [{"category": "Deployment", "tests": [{"name": "software",
                                                        "results": [entity(g, "Pass") for g in gpus],
                                                        "test_summary": {"status": "Pass"}}]}]
    for category, key, _title in tests:
        results = []
        for gpu in gpus:
            failure = failures.get((key, gpu))
            results.append(entity(gpu, "Fail", {"warnings": [failure]}) if failure else entity(gpu, "Pass"))
        block = next((c for c in categories if c["category"] == category), None)
        if block is None:
            block = {"category": category, "tests": []}
            categories.append(block)
        block["tests"].append({"name": key, "results": results,
                               "test_summary": {"status": "Fail" if any(r["status"] == "Fail" for r in results)
                                                else "Pass"}})
    return {"DCGM Diagnostic": {"test_categories": categories},
            "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1,
                               "entities": [{"entity_id": g, "device_id": "2335", "serial_num": f"165{g:010d}"}
                                            for g in gpus]}],
            "metadata": {"Driver Version Detected": "570.124.06", "version": version}}


# --- all_reduce_perf --------------------------------------------------------------------------------

def _size(text: str) -> int:
    units = {"K": 1024, "M": MiB, "G": 1024 * MiB}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def all_reduce_perf(args: list[str]) -> int:
    prof = profile()
    gpus = prof.get("gpus") or []
    opts = {args[i]: args[i + 1] for i in range(0, len(args) - 1) if args[i].startswith("-")}
    lo, hi = _size(opts.get("-b", "8")), _size(opts.get("-e", "8G"))
    factor = int(opts.get("-f", "2"))
    ngpus = int(opts.get("-g", str(len(gpus))))
    if ngpus > len(gpus):
        print(f"Invalid number of GPUs: {ngpus} requested but only {len(gpus)} were found.", file=sys.stderr)
        print("Please check the number of processes and GPUs per process.", file=sys.stderr)
        return 2
    # GB/s busbw at 8 GiB: an 8x H200 reaches ~477; a third of one GPU's NVLinks down costs ~30%.
    peak = 180.0 if faults(prof, "nccl-slow") else 330.0 if faults(prof, "nvlink-slow") else 477.0
    rows, size = [], lo
    while size <= hi:
        # Bandwidth grows with the message size and saturates around 1 GiB, as on NVLink.
        share = size / (size + 64 * MiB)
        busbw = peak * share
        algbw = busbw * ngpus / (2 * (ngpus - 1)) if ngpus > 1 else busbw
        time_us = size / (algbw * 1e3) if algbw else 0.0
        rows.append((size, size // 4, algbw, busbw, time_us))
        size = size * factor if factor > 1 else size + 1
    host = os.uname().nodename
    print("# nccl-tests version 2.17.1 nccl-headers=22703 nccl-library=22703")
    print("# Collective test starting: all_reduce_perf")
    print(f"# nThread 1 nGpus {ngpus} minBytes {lo} maxBytes {hi} step: {factor}(factor) warmup iters: 1 iters: 20 "
          "agg iters: 1 validation: 1 graph: 0")
    print("#")
    print("# Using devices")
    for g in gpus[:ngpus]:
        bus = g["pci_bus"].split(":")
        print(f"#  Rank {g['index']:2d} Group  0 Pid {os.getpid():6d} on {host:>10s} device {g['index']:2d} "
              f"[{bus[0][-4:]}:{bus[1]}:{bus[2].split('.')[0]}] {g['name']}")
    print("#")
    print(f"# {'':>10s}  {'':>12s}  {'':>8s}  {'':>6s}  {'':>6s}           out-of-place                       in-place          ")
    print(f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  {'time':>7s}  {'algbw':>6s}  "
          f"{'busbw':>6s}  {'#wrong':>6s}  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s} ")
    print(f"# {'(B)':>10s}  {'(elements)':>12s}  {'':>8s}  {'':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  "
          f"{'(GB/s)':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>6s} ")
    for size, count, algbw, busbw, time_us in rows:
        print(f"{size:12d}  {count:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}  {time_us:7.1f}  {algbw:6.2f}  "
              f"{busbw:6.2f}  {0:6d}  {time_us:7.1f}  {algbw:6.2f}  {busbw:6.2f}  {0:6d}")
    avg = sum(r[3] for r in rows) / len(rows) if rows else 0.0
    print("# Out of bounds values : 0 OK")
    print(f"# Avg bus bandwidth    : {avg:g} ")
    print("#")
    print("# Collective test concluded: all_reduce_perf")
    if "-J" in opts:
        report = {"version": 2, "start_time": time.strftime("%Y-%m-%d %H:%M:%S"), "args": ["all_reduce_perf", *args],
                  "env": [], "nccl_version": 22703,
                  "config": {"nthreads": 1, "ngpus": ngpus, "minimum_bytes": lo, "maximum_bytes": hi,
                             "step_factor": factor, "warmup_iters": 1, "iterations": 20, "aggregated_iterations": 1,
                             "validation": 1, "graph": 0, "blocking_collectives": "false",
                             "per_iter_timing": "false", "parallel_init": "false",
                             "devices": [{"rank": g["index"], "group": 0, "pid": os.getpid(), "hostname": host,
                                          "device": g["index"], "device_hex": g["pci_bus"], "device_info": g["name"]}
                                         for g in gpus[:ngpus]]},
                  "results": [{"size": s, "count": c, "type": "float", "redop": "sum", "root": "    -1",
                               "out_of_place": {"time": t, "alg_bw": a, "bus_bw": b, "nwrong": 0.0},
                               "in_place": {"time": t, "alg_bw": a, "bus_bw": b, "nwrong": 0.0},
                               "actual_iterations": 20, "experiment_name": "all_reduce_perf"}
                              for s, c, a, b, t in rows],
                  "out_of_bounds": {"count": 0, "okay": "true"},
                  "average_bus_bandwidth": {"bandwidth": avg, "okay": "unchecked"},
                  "errors": [], "end_time": time.strftime("%Y-%m-%d %H:%M:%S")}
        Path(opts["-J"]).write_text(json.dumps(report))
    return 0


# --- nvme / hdparm: the drive's own erase, on the lab's disk files ---------------------------------------

def _disk(prof: dict, path: str) -> dict | None:
    return next((d for d in prof.get("disks", []) if os.path.realpath(d["path"]) == os.path.realpath(path)), None)


def _indeterminate(path: str, fault: str | None, thin: bool = False) -> None:
    """What a drive's erase leaves: content nobody can predict (here: a keystream under a fresh random key,
    as after a cryptographic erase; on a thin disk zeros, as a drive that reads zeros after a sanitize, and the file
    stays sparse). erase-skips-region leaves the middle quarter as it was."""
    size = os.path.getsize(path)
    skip = (size * 3 // 8 // 4096 * 4096, size * 5 // 8 // 4096 * 4096) if fault == "erase-skips-region" else None
    if thin:
        from lab.hardware import punch_hole
        with open(path, "r+b") as f:
            for start, end in ((0, skip[0]), (skip[1], size)) if skip else ((0, size),):
                punch_hole(f.fileno(), start, end - start)
            os.fsync(f.fileno())
        return
    block = os.urandom(MiB)
    with open(path, "r+b") as f:
        offset = 0
        while offset < size:
            n = min(MiB, size - offset)
            piece = (offset, offset + n)
            if skip and piece[0] < skip[1] and piece[1] > skip[0]:
                for s, e in ((piece[0], max(piece[0], skip[0])), (min(piece[1], skip[1]), piece[1])):
                    if s < e:
                        f.seek(s)
                        f.write(block[s - offset:e - offset])
            else:
                f.seek(offset)
                f.write(block[:n])
            block = block[7:] + block[:7]  # not one repeated block: indeterminate, not a pattern
            offset += n
        f.flush()
        os.fsync(f.fileno())


def nvme(args: list[str]) -> int:
    if not args:
        print("usage: nvme <command> [<device>] [<args>]", file=sys.stderr)
        return 1
    if args[0] == "version":
        print("nvme version 2.8 (git 2.8) (lab)")
        return 0
    prof = profile()
    cmd, path = args[0], (args[1] if len(args) > 1 else "")
    disk = _disk(prof, path)
    if disk is None:
        print(f"Failed to open {path}: No such file or directory", file=sys.stderr)
        return 1
    if disk.get("type") != "nvme":
        print(f"{path}: not an NVMe device", file=sys.stderr)
        return 1
    fault = disk.get("fault")
    if cmd == "id-ctrl":
        print(json.dumps({"vid": 5197, "sn": disk.get("serial"), "mn": disk.get("model"), "fr": "LAB10001",
                          "fna": int(disk.get("fna", 0x4)), "sanicap": int(disk.get("sanicap", 0x3)), "oacs": 0x5f}))
        return 0
    if cmd == "format":
        if fault == "erase-fails":
            print("NVMe status: INTERNAL: The command was not completed successfully due to an internal "
                  "error(0x6)", file=sys.stderr)
            return 6
        _indeterminate(path, fault, bool(disk.get("thin")))
        print("Success formatting namespace:1")
        return 0
    if cmd == "sanitize":
        if fault == "erase-fails":
            print("NVMe status: SANITIZE_FAILED: The most recent sanitize operation failed and no recovery "
                  "action has been successfully completed(0x1c)", file=sys.stderr)
            return 28
        _indeterminate(path, fault, bool(disk.get("thin")))
        state = Path(os.environ["VMETAL_LAB_PROFILE"]).with_name(f"sanitize-{disk['name']}.json")
        state.write_text(json.dumps({"sprog": 65535, "sstat": 1}))
        print("Sanitize device: Success")
        return 0
    if cmd == "sanitize-log":
        state = Path(os.environ["VMETAL_LAB_PROFILE"]).with_name(f"sanitize-{disk['name']}.json")
        log = json.loads(state.read_text()) if state.exists() else {"sprog": 65535, "sstat": 0}
        print(json.dumps({os.path.basename(path): {**log, "cdw10_info": 0, "time_over_write": 4294967295}}))
        return 0
    print(f"nvme {cmd}: not simulated in the lab", file=sys.stderr)
    return 1


def hdparm(args: list[str]) -> int:
    if args[:1] == ["-V"]:
        print("hdparm v9.65 (lab)")
        return 0
    prof = profile()
    path = args[-1] if args else ""
    disk = _disk(prof, path)
    if disk is None or disk.get("type") == "nvme":
        print(f"{path}: HDIO_DRIVE_CMD(identify) failed: Inappropriate ioctl for device", file=sys.stderr)
        return 25
    state_file = Path(os.environ["VMETAL_LAB_PROFILE"]).with_name(f"ata-{disk['name']}.json")
    state = json.loads(state_file.read_text()) if state_file.exists() else {"password": None}
    enhanced = disk.get("enhanced_erase", True)
    if args[0] == "-I":
        frozen = _frozen(disk, state)
        enabled = state["password"] is not None
        print(f"\n{path}:\n\nATA device, with non-removable media\n\tModel Number:       {disk.get('model')}\n"
              f"\tSerial Number:      {disk.get('serial')}\n")
        print("Security: \n\tMaster password revision code = 65534\n\t\tsupported\n"
              f"\t{'' if enabled else 'not'}\tenabled\n\tnot\tlocked\n\t{'' if frozen else 'not'}\tfrozen\n"
              f"\tnot\texpired: security count\n\t{'' if enhanced else 'not'}\tsupported: enhanced erase\n"
              + ("\t2min for SECURITY ERASE UNIT. 2min for ENHANCED SECURITY ERASE UNIT." if enhanced else
                 "\t4min for SECURITY ERASE UNIT."))
        print("Logical Unit WWN Device Identifier: 5002538e40000000")
        return 0
    if _frozen(disk, state) and any(a.startswith("--security-") for a in args):
        print("SECURITY_SET_PASS: Input/output error", file=sys.stderr)  # a frozen drive aborts security commands
        return 5
    if "--security-set-pass" in args:
        state["password"] = args[args.index("--security-set-pass") + 1]
        state_file.write_text(json.dumps(state))
        print(f"security_password: \"{state['password']}\"\n\n{path}:\n Issuing SECURITY_SET_PASS command, "
              "password=\"...\", user=user, mode=high")
        return 0
    for flag in ("--security-erase-enhanced", "--security-erase", "--security-disable"):
        if flag in args:
            if args[args.index(flag) + 1] != state["password"]:
                print("SECURITY_ERASE: Input/output error", file=sys.stderr)
                return 5
            if flag == "--security-erase-enhanced" and not enhanced:
                print("SECURITY_ERASE: Input/output error", file=sys.stderr)  # the drive aborts what it lacks
                return 5
            if flag != "--security-disable":
                if disk.get("fault") == "erase-fails":
                    print("SECURITY_ERASE: Input/output error", file=sys.stderr)
                    return 5
                _indeterminate(path, disk.get("fault"), bool(disk.get("thin")))
            state["password"] = None
            state_file.write_text(json.dumps(state))
            print(f"{path}:\n Issuing {flag[2:].upper().replace('-', '_')} command, password=\"...\", user=user")
            return 0
    print("hdparm: option not simulated in the lab", file=sys.stderr)
    return 1


def _frozen(disk: dict, state: dict) -> bool:
    """Frozen at boot, unless a suspend to RAM thawed it since ("always": frozen again on resume)."""
    return bool(disk.get("frozen")) and (disk.get("frozen") == "always" or not state.get("thawed"))


def rtcwake(args: list[str]) -> int:
    """Suspend to RAM and wake (`rtcwake -m mem -s N`), as the lab plays it: nothing is suspended; the call is
    logged and each frozen drive that a resume thaws is thawed."""
    prof = profile()
    mode = args[args.index("-m") + 1] if "-m" in args else "standby"
    base = Path(os.environ["VMETAL_LAB_PROFILE"])
    with open(base.with_name("rtcwake.log"), "a") as log:
        log.write(" ".join(["rtcwake", *args]) + "\n")
    if mode != "mem":
        print(f"rtcwake: mode {mode} is not simulated in the lab", file=sys.stderr)
        return 1
    for disk in prof.get("disks", []):
        if disk.get("frozen") and disk.get("frozen") != "always":
            state_file = base.with_name(f"ata-{disk['name']}.json")
            state = json.loads(state_file.read_text()) if state_file.exists() else {"password": None}
            state_file.write_text(json.dumps({**state, "thawed": True}))
    print(f"rtcwake: assuming RTC uses UTC ...\nrtcwake: wakeup from \"{mode}\" using /dev/rtc0 at "
          f"{time.strftime('%a %b %d %H:%M:%S %Y', time.gmtime(time.time() + 10))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in TOOLS:
        print(f"usage: python -m lab.fake_tools {{{','.join(TOOLS)}}} ARGS", file=sys.stderr)
        return 2
    tool, args = argv[0], argv[1:]
    return {"nvidia-smi": nvidia_smi, "dcgmi": dcgmi, "all_reduce_perf": all_reduce_perf, "nvme": nvme,
            "hdparm": hdparm, "rtcwake": rtcwake}[tool](args)


def install(directory: Path, python: str = sys.executable) -> Path:
    """Write the shims (one per tool) into `directory`; put it first on the agent's PATH."""
    root = Path(__file__).resolve().parent.parent
    directory.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        shim = directory / tool
        shim.write_text(f'#!/bin/sh\nPYTHONPATH="{root}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{python}" -m lab.fake_tools '
                        f'{tool} "$@"\n')
        shim.chmod(0o755)
    return directory


if __name__ == "__main__":
    sys.exit(main())
