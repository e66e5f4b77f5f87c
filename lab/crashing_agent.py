"""The lab's `agent-crash` fault: the real agent, killed (exit 137, no result, no goodbye) the moment it
starts its first command, as a ramdisk that panics would. python -m lab.crashing_agent takes the agent's
arguments."""
import os
import sys

from agent import cli, runner


def _crash(name, args, ctx):
    sys.stderr.write(f"lab: agent crashes while starting {name}\n")
    os._exit(137)


runner.execute = _crash

if __name__ == "__main__":
    sys.exit(cli.main())
