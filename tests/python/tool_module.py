"""Loads a script of tools/ as a module, for the tests that call its functions directly."""

import importlib.util
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def load(name: str):
    """tools/<name>.py as the module lkw_tools_<name>, registered in sys.modules (loaded once)."""
    if f"lkw_tools_{name}" in sys.modules:
        return sys.modules[f"lkw_tools_{name}"]
    spec = importlib.util.spec_from_file_location(f"lkw_tools_{name}", TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
