"""`python -m agent`: the ramdisk agent's entry point."""
import sys

from agent.cli import main

sys.exit(main())
