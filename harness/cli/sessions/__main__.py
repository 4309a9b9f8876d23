"""``python -m harness.cli.sessions ARGS``: ``harness sessions ARGS``."""

import sys

from harness.cli.sessions import run

sys.exit(run(["sessions", *sys.argv[1:]]))
