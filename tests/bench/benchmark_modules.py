"""Loading a module of ``benchmarks/`` (not a package) in a test, with its
neighbours importable while it loads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module, registered in ``sys.modules`` (its
    dataclasses look their module up there) under ``<name>_benchmark``."""
    spec = importlib.util.spec_from_file_location(
        f"{name}_benchmark", ROOT / "benchmarks" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    path = list(sys.path)
    sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "servers")]
    try:
        spec.loader.exec_module(module)  # it imports its benchmarks/ neighbours
    finally:
        sys.path[:] = path
    return module
