"""What every stream test starts from: the shared test model's class state reset (and
a step held at its gate let go at the end)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .models import Counter


@pytest.fixture(autouse=True)
def _fresh_counter() -> Iterator[None]:
    Counter.steps = []
    Counter.gate = None
    yield
    if Counter.gate is not None:
        Counter.gate.set()
    Counter.gate = None
