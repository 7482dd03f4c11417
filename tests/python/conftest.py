"""Shared pytest setup: makes reference/ importable (``import lkw``) and gives every test a
random generator that is fresh each run but repeatable from the printed seed."""

import os
import secrets
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

REFERENCE = Path(__file__).resolve().parents[2] / "reference"
if str(REFERENCE) not in sys.path:
    sys.path.insert(0, str(REFERENCE))

SEED = int(os.environ.get("LKW_SEED") or secrets.randbelow(2**32))


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"lkw: seed {SEED} (set LKW_SEED to repeat)")


@pytest.fixture
def rng(request):
    """Seeded from the session seed and the test's id, so one test's data never shifts another's."""
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])
