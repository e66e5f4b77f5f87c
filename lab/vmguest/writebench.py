"""The ramdisk's write benchmark (`vmetal.writebench=URL vmetal.writebench_sha256=HEX [vmetal.writebench_rounds=N]`
on the kernel command line, run by /init; bench/vm.py boots it): the agent's `write_image` of the image at URL
onto the first NVMe, against `dd` of the same download (busybox wget | dd bs=4M oflag=direct) in the same boot,
alternately, N rounds each; then Python's sha256 (OpenSSL) alone over the image in memory: what the agent's
checksum costs on this CPU (busybox's sha256sum is slower still: 1.4 MiB/s under TCG). Prints one JSON line per run between `=== writebench` and `=== end writebench`."""
import hashlib
import json
import subprocess
import sys
import time
import urllib.request

from agent.commands.base import Context
from agent.commands.registry import execute
from agent.hardware import LinuxHardware


def main(url: str, sha256: str, rounds: int) -> int:
    ctx = Context(hardware=LinuxHardware())
    disk = next(d for d in ctx.hardware.disks() if d.name.startswith("nvme"))
    for round_no in range(rounds):
        started = time.monotonic()
        outcome = execute("write_image", {"url": url, "checksum": sha256, "checksum_type": "sha256",
                                          "disk": disk.name}, ctx)
        agent_s = time.monotonic() - started
        if not outcome.ok:
            print(json.dumps({"round": round_no, "tool": "agent", "error": outcome.error}), flush=True)
            return 1
        written = outcome.result["bytes_written"]
        print(json.dumps({"round": round_no, "tool": "agent", "bytes": written, "seconds": round(agent_s, 3)}),
              flush=True)
        started = time.monotonic()
        dd = subprocess.run(f"wget -q -O - '{url}' | dd of={disk.path} bs=4M oflag=direct iflag=fullblock",
                            shell=True, capture_output=True, text=True, check=False)
        dd_s = time.monotonic() - started
        print(json.dumps({"round": round_no, "tool": "dd", "bytes": written, "seconds": round(dd_s, 3),
                          "exit": dd.returncode, "output": dd.stderr.strip()[-300:]}), flush=True)
    with urllib.request.urlopen(url) as response:
        data = response.read()
    started = time.monotonic()
    hashlib.sha256(data).hexdigest()
    print(json.dumps({"round": 0, "tool": "sha256", "bytes": len(data), "seconds": round(time.monotonic() - started, 3)}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3] or 3) if len(sys.argv) > 3 else 3))
