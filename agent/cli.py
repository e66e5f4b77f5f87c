"""Command line of the agent: `python -m agent --console URL [--hardware linux|MODULE:CALLABLE] [--log-file F] [--once]`."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from agent import __version__, bootconfig
from agent.commands.base import Context
from agent.commands.inspection import inspect
from agent.hardware import HardwareError, load_hardware
from agent.runner import Agent

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m agent", description="vMetal ramdisk agent: pulls work from the console.")
    parser.add_argument("--console", help="the console's agent listener, e.g. http://10.0.0.1:8001 (default: "
                                          "vmetal.console= from the boot configuration)")
    parser.add_argument("--boot-config", default="/proc/cmdline",
                        help="where the boot path left vmetal.console= and vmetal.boot_secret= (default /proc/cmdline; "
                             "virtual media: VMETAL.CFG on the CD)")
    parser.add_argument("--hardware", default="linux",
                        help="'linux' (default), or MODULE:CALLABLE: a Hardware supplied by the caller, e.g. a simulated "
                             "server (agent/hardware.py)")
    parser.add_argument("--hardware-arg", help="the one argument CALLABLE of --hardware MODULE:CALLABLE is called with")
    parser.add_argument("--log-file", help="also log to this file")
    parser.add_argument("--once", action="store_true", help="exit after the first command's result is reported")
    parser.add_argument("--allow-reboot", action="store_true",
                        help="on real hardware, run `reboot` after reboot_to_disk is reported (else just exit)")
    parser.add_argument("--tmp-dir", help="where qcow2 images are downloaded before conversion (default: $TMPDIR)")
    parser.add_argument("--print-inventory", action="store_true", help="print what `inspect` reports, as JSON, and exit")
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"vmetal-agent {__version__}")
    args = parser.parse_args(argv)
    args.boot = bootconfig.read(args.boot_config)
    args.console = args.console or args.boot.console
    if not args.console and not args.print_inventory:
        parser.error("no console: give --console or boot with vmetal.console= on the kernel command line")
    return args


def setup_logging(log_file: str | None, verbose: bool = False) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=LOG_FORMAT, handlers=handlers, force=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_file, args.verbose)
    log = logging.getLogger("agent")
    try:
        hardware = load_hardware(args.hardware, args.hardware_arg)
    except HardwareError as exc:
        log.error("%s", exc)
        return 2
    if args.print_inventory:
        json.dump(inspect({}, Context(hardware=hardware)), sys.stdout, indent=2)
        print()
        return 0
    if not args.boot.boot_secret:
        log.warning("no vmetal.boot_secret in %s: the console will refuse our lookup", args.boot_config)
    agent = Agent(args.console, hardware, allow_reboot=args.allow_reboot, once=args.once, tmp_dir=args.tmp_dir,
                  boot_secret=args.boot.boot_secret)
    # The lab powers a server off by ending its agent: stop at the next wait instead of dying mid-request.
    signal.signal(signal.SIGTERM, lambda signum, frame: agent.stop())
    try:
        return agent.run()
    except KeyboardInterrupt:
        log.info("interrupted")
        return 130
