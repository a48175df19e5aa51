"""Shared helpers for the test suite, and the ``--long`` tier.

``pytest`` runs everything, the reliability tests at short durations (real servers,
real faults, a few seconds each). ``pytest --long`` runs only the tests marked
``long`` (the reliability figures: kill storm, soak, overload), at full length.
See docs/testing.md.
"""

from __future__ import annotations

import asyncio

import pytest

_long = False


def long_figures() -> bool:
    """Whether this run is ``pytest --long`` (known once pytest is configured,
    before any test module is imported)."""
    return _long


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="run only the tests marked long (the reliability figures), at full length",
    )


def pytest_configure(config: pytest.Config) -> None:
    global _long
    _long = bool(config.getoption("--long"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _long:
        return
    short = [item for item in items if item.get_closest_marker("long") is None]
    if short:
        config.hook.pytest_deselected(items=short)
        items[:] = [item for item in items if item.get_closest_marker("long") is not None]


async def settle(rounds: int = 20) -> None:
    """Let every ready task and callback run (no time passes on a FakeClock)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
