"""The ramdisk agent: runs on a server booted for provisioning and pulls work from the console.

Plain Python 3.11, standard library only except `pycdlib` (cloud-init seed ISO). No Django:
the same code runs from the provisioning ramdisk on real hardware and, in the lab, as one
local process per simulated server, with the simulated hardware the lab supplies through the agent's hardware
interface (`--hardware MODULE:CALLABLE`, agent/hardware.py); the agent itself carries no lab code.

Layout:
    agent/cli.py         `python -m agent ...`: arguments, logging, main()
    agent/runner.py      Agent: lookup → heartbeat → run command → post result, with retries
    agent/client.py      ConsoleClient: the HTTP side of the protocol (urllib), Backoff
    agent/hardware.py    Hardware (the interface), LinuxHardware (/proc, /sys, nvidia-smi), load_hardware
    agent/disks.py       root disk choice (Ironic's rules and root device hints), zeroing helpers
    agent/seed.py        cloud-init NoCloud seed: build the ISO, write it to the disk's last 64 MiB, read it back
    agent/sanitize.py    the cleaning policy's erase methods (metadata, full, NVMe/ATA secure) and fallbacks
    agent/verify.py      canaries and samples, planted and read back with O_DIRECT: did the erase happen?
    agent/commands/      one module per command, base.py (Context), registry.py (execute(name, args, ctx): one
                         command without HTTP)
"""

__version__ = "0.1.0"
