"""LLM Kernel Workbook: Python references, quant packers, golden-data writer and tools.

The pure-Python parts live here (reference/lkw); the compiled extension ``lkw._ext`` is built by
CMake into ``<build>/python/lkw`` and found through the package path below (the build directory
is ``$LKW_BUILD_DIR``, default ``<repo>/build``).
"""

import os as _os

REPO = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
BUILD_DIR = _os.environ.get("LKW_BUILD_DIR", _os.path.join(REPO, "build"))
__path__.append(_os.path.join(BUILD_DIR, "python", "lkw"))  # noqa: F821  (package __path__)
