"""``python -m harness.fuzz`` is ``harness fuzz``."""

from __future__ import annotations

import argparse
import sys

from harness.fuzz._runner import add_arguments, main

parser = argparse.ArgumentParser(prog="python -m harness.fuzz", description=main.__doc__)
add_arguments(parser)
sys.exit(main(parser.parse_args()))
