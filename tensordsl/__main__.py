"""`python -m tensordsl ...`: see tensordsl.cli."""

import sys

from tensordsl.cli import main

sys.exit(main(prog="python -m tensordsl"))
