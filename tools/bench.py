#!/usr/bin/env python3
"""lkw-bench: verify, time and report the registered versions (see reference/lkw/bench.py)."""

import os
import sys

# The package, and not this script's folder: tools/profile.py would shadow the standard library's
# profile module, which libraries the bench imports (Liger's Triton) load.
here = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0]) == here:
    sys.path.pop(0)
sys.path.insert(0, os.path.join(os.path.dirname(here), "reference"))

from lkw.bench import main

if __name__ == "__main__":
    sys.exit(main())
