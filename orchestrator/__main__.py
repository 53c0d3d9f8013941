import sys

from orchestrator.cli import run

sys.exit(run())
