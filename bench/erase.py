"""Full erase plus verification of a file-backed disk, against `dd` writing zeros to the same filesystem.

  .venv/bin/python bench/erase.py [--size 2G] [--dir DIR] [--repeat 7]

One run, on one filesystem (DIR, default var/bench-erase): a SIZE disk file full of random "tenant data";
then, alternately and REPEAT times each, `dd` writing zeros over it (both the usual buffered form with a final
fsync and the O_DIRECT form; the faster one is the reference) and the agent's `erase` command with the
`full` policy (canaries planted with O_DIRECT, a 1 % sample fingerprinted, every byte overwritten, fsync),
the file refilled with data before each. Reports the ratio of throughputs, erase / dd (target ≥ 0.9), and
the verification cost on its own: `verify_erase` sampled (1 %) and full read-back. Medians of the repeats.
No database, no console: the agent's commands are called directly, as the agent runs them.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent import sanitize  # noqa: E402
from agent.commands.base import Context  # noqa: E402
from agent.commands.registry import execute  # noqa: E402
from lab.hardware import LabHardware  # noqa: E402

MiB = 1024 * 1024
KEY = "b3" * 32


def size_arg(text: str) -> int:
    units = {"M": MiB, "G": 1024 * MiB}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def fill(path: Path, size: int) -> None:
    """Dense, non-zero content (the tenant's data), flushed to the disk before anything is timed."""
    block = os.urandom(8 * MiB)
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    os.posix_fadvise(os.open(path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)


def drop_caches() -> None:
    """Start each timed run from the same place: nothing dirty, nothing cached (when we may)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass


def timed(fn) -> float:
    drop_caches()
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def dd(path: Path, size: int, direct: bool) -> None:
    flags = ["oflag=direct", "conv=notrunc"] if direct else ["conv=notrunc,fsync"]
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=8M", f"count={size // (8 * MiB)}", *flags],
                   check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=size_arg, default=size_arg("2G"))
    parser.add_argument("--dir", type=Path, default=ROOT / "var" / "bench-erase")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    disk = args.dir / "disk0.img"
    profile = args.dir / "hardware.json"
    profile.write_text(json.dumps({"nics": [{"mac": "52:54:00:00:00:01"}], "disks": [
        {"name": "nvme0n1", "path": str(disk), "type": "nvme", "serial": "BENCH0", "model": "bench"}]}))
    hardware = LabHardware.from_file(profile)
    fs = subprocess.run(["df", "-T", str(args.dir)], capture_output=True, text=True).stdout.splitlines()[-1].split()
    print(f"disk file {disk} ({args.size / MiB:.0f} MiB) on {fs[0]} ({fs[1]}); {os.cpu_count()} CPUs")

    times = {"dd buffered+fsync": [], "dd O_DIRECT": [], "erase (full)": [], "overwrite only": [],
             "verify sampled 1%": [], "verify full": []}
    results = {}
    for i in range(args.repeat):
        for direct in (False, True):
            fill(disk, args.size)
            times["dd O_DIRECT" if direct else "dd buffered+fsync"].append(timed(lambda: dd(disk, args.size, direct)))
        fill(disk, args.size)
        ctx = Context(hardware=hardware, tmp_dir=str(args.dir))
        erase_id = f"bench-{i}"
        times["erase (full)"].append(timed(lambda: results.update(erase=execute(
            "erase", {"erase_id": erase_id, "key": KEY, "method": "full"}, ctx))))
        assert results["erase"].ok, results["erase"].error
        for mode in ("sampled", "full"):
            key = "verify sampled 1%" if mode == "sampled" else "verify full"
            times[key].append(timed(lambda: results.update({mode: execute(
                "verify_erase", {"erase_id": erase_id, "key": KEY, "mode": mode}, ctx)})))
            assert results[mode].ok and results[mode].result["passed"], results[mode]
        fill(disk, args.size)  # the overwrite alone, without canaries and fingerprints: what they cost
        times["overwrite only"].append(timed(lambda: sanitize.write_zeros(str(disk), [(0, args.size)])))
    median = {k: statistics.median(v) for k, v in times.items()}
    dd_best = min(median["dd buffered+fsync"], median["dd O_DIRECT"])
    mb = args.size / MiB
    print(f"\n{'measure':<22}{'median s':>10}{'MiB/s':>10}   runs")
    for name, value in median.items():
        read = {"verify sampled 1%": results["sampled"].result["disks"][0]["bytes_read"] / MiB,
                "verify full": results["full"].result["disks"][0]["bytes_read"] / MiB}.get(name, mb)
        print(f"{name:<22}{value:>10.2f}{read / value:>10.0f}   {', '.join(f'{t:.2f}' for t in times[name])}")
    ratio = dd_best / median["erase (full)"]
    print(f"\nerase throughput / dd throughput (the faster dd) = {ratio:.2f} on medians (target >= 0.9)")
    print(f"verification: sampled {median['verify sampled 1%']:.2f} s "
          f"({results['sampled'].result['disks'][0]['bytes_read'] / MiB:.1f} MiB read, "
          f"{100 * median['verify sampled 1%'] / median['erase (full)']:.1f} % of the erase), full "
          f"{median['verify full']:.2f} s ({results['full'].result['disks'][0]['bytes_read'] / MiB:.0f} MiB read)")
    shutil.rmtree(args.dir, ignore_errors=True)
    if ratio < 0.9:
        sys.exit(1)


if __name__ == "__main__":
    main()
