"""Finding what to serve: a ``MODULE:ATTR`` string (as uvicorn does), and the object
it names as a :class:`~microbatch.types.Servable`."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from .types import Servable

__all__ = ["as_servable", "load_target"]


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


def as_servable(served: object) -> Servable[Any, Any]:
    """``served``, checked to speak the contract every front door speaks
    (:class:`~microbatch.types.Servable`): a :class:`~microbatch.Service` and a
    ``@microbatch.batch`` function do.

    Raises:
        TypeError: ``served`` does not.
    """
    if isinstance(served, Servable) and not isinstance(served, type):
        return served
    raise TypeError(
        f"expected a microbatch.Service or a @microbatch.batch function, got {served!r}"
    )
