"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.pool_models import Gate


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Gate]:
    """Named pipes between the test and a ``Gated`` model (see :class:`Gate`)."""
    gate = Gate(tmp_path)
    yield gate
    gate.close()
