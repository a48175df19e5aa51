"""Finding what to serve from a ``MODULE:ATTR`` string, as uvicorn does."""

from __future__ import annotations

import importlib
import os
import sys

__all__ = ["load_target"]


def load_target(spec: str) -> object:
    """Import ``MODULE:ATTR`` (ATTR may be dotted), with the working directory importable.

    Raises:
        ValueError: ``spec`` is not ``MODULE:ATTR``.
        ImportError: The module cannot be imported.
        AttributeError: The module has no such attribute.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"expected MODULE:ATTR (e.g. examples.embeddings:service), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    target: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target
