"""`python -m benchmarks.gpu_check`: see the package's docstring."""

import sys

from benchmarks.gpu_check import main

sys.exit(main())
