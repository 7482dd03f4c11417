#!/usr/bin/env python3
"""lkw-bench: verify, time and report the registered versions (see reference/lkw/bench.py)."""

import os
import sys

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference")
)

from lkw.bench import main

if __name__ == "__main__":
    sys.exit(main())
