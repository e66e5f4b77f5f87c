"""Command line of the agent: `python -m agent --console URL [--hardware linux|lab:PROFILE] [--log-file F] [--once]`."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from agent import __version__
from agent.commands import Context
from agent.commands.inspection import inspect
from agent.hardware import HardwareError, load_hardware
from agent.runner import Agent

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m agent", description="vMetal ramdisk agent: pulls work from the console.")
    parser.add_argument("--console", help="console base URL, e.g. http://10.0.0.1:8000")
    parser.add_argument("--hardware", default="linux", help="'linux' (default) or 'lab:/path/profile.json'")
    parser.add_argument("--log-file", help="also log to this file")
    parser.add_argument("--once", action="store_true", help="exit after the first command's result is reported")
    parser.add_argument("--allow-reboot", action="store_true",
                        help="on real hardware, run `reboot` after reboot_to_disk is reported (else just exit)")
    parser.add_argument("--tmp-dir", help="where qcow2 images are downloaded before conversion (default: $TMPDIR)")
    parser.add_argument("--print-inventory", action="store_true", help="print what `inspect` reports, as JSON, and exit")
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"vmetal-agent {__version__}")
    args = parser.parse_args(argv)
    if not args.console and not args.print_inventory:
        parser.error("--console is required")
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
        hardware = load_hardware(args.hardware)
    except HardwareError as exc:
        log.error("%s", exc)
        return 2
    if args.print_inventory:
        json.dump(inspect({}, Context(hardware=hardware)), sys.stdout, indent=2)
        print()
        return 0
    agent = Agent(args.console, hardware, allow_reboot=args.allow_reboot, once=args.once, tmp_dir=args.tmp_dir)
    # The lab powers a server off by ending its agent: stop at the next wait instead of dying mid-request.
    signal.signal(signal.SIGTERM, lambda signum, frame: agent.stop())
    try:
        return agent.run()
    except KeyboardInterrupt:
        log.info("interrupted")
        return 130
