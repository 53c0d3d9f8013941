import sys

from orchestrator.cli import main

sys.exit(main())
