"""Reading type hints: the per-item types of a batch function from its annotations,
the dtype an ``np.ndarray`` annotation declares, and whether a type is a pydantic
model."""

from __future__ import annotations

import collections.abc
import inspect
import sys
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["declared_dtype", "is_pydantic_model", "item_types"]


def item_types(batch_function: Callable[..., Any]) -> tuple[Any, Any]:
    """The per-item input and output types of ``f(batch: list[In]) -> list[Out]``.

    Missing or unreadable hints give ``Any`` (accept any JSON value).
    """
    try:
        hints = typing.get_type_hints(batch_function)
        parameters = [
            p for p in inspect.signature(batch_function).parameters.values() if p.name != "self"
        ]
    except (NameError, TypeError, ValueError):
        return Any, Any
    batch_hint = hints.get(parameters[0].name, Any) if parameters else Any
    return _element_type(batch_hint), _without_errors(_element_type(hints.get("return", Any)))


def _without_errors(hint: Any) -> Any:
    """``Out`` from ``Out | SomeError``: an exception in a result list fails its item,
    it is never encoded as a response."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return hint
    kept = [
        arg
        for arg in typing.get_args(hint)
        if not (inspect.isclass(arg) and issubclass(arg, BaseException))
    ]
    return typing.Union[tuple(kept)] if kept else Any  # noqa: UP007 (built from a list)


def _element_type(hint: Any) -> Any:
    """``T`` from ``list[T]``, ``Sequence[T]``, ``Awaitable[list[T]]``; else ``Any``."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is not None and args and inspect.isclass(origin):
        if issubclass(origin, collections.abc.Awaitable):
            return _element_type(args[0])
        if issubclass(origin, collections.abc.Sequence) and len(args) == 1:
            return args[0]
    return Any


def declared_dtype(hint: Any) -> Any:
    """``np.float32`` from ``np.ndarray[Any, np.dtype[np.float32]]``; else ``None``."""
    args = typing.get_args(hint)
    if len(args) == 2:
        scalar = typing.get_args(args[1])
        if scalar and isinstance(scalar[0], type):
            return scalar[0]
    return None


def is_pydantic_model(kind: Any) -> bool:
    """Whether ``kind`` is a pydantic model class (False when pydantic is not imported)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(kind, type) and issubclass(kind, pydantic.BaseModel)
