"""Issue 6, item 1: exactly once under random schedules.

The property of tests/integration/test_properties.py, at the issue's size: at least
500 hypothesis schedules (under ``pytest --long``; 100 in the default run, where
tests/integration/test_properties.py runs 400 more of the same property) on a fake
clock of arrivals, cancellations, deadlines, poison items, size_fn, worker deaths
and clock advances, under random settings. Each schedule checks that every call is
resolved exactly once with its own answer, that no batch is over its limit, that no
cancelled or expired item is computed and that nothing hangs; this test adds up
the outcomes for the figure.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from tests.integration.test_properties import (
    Advance,
    Cancel,
    Kill,
    Submit,
    run_schedule,
    schedules,
    settings_of_a_run,
)

from .harness import lasting, report

EXAMPLES = int(lasting(100, 500))


@pytest.mark.long
def test_every_call_is_resolved_exactly_once_with_its_own_answer() -> None:
    outcomes: Counter[str] = Counter()
    runs = 0

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,  # EXAMPLES fresh schedules every time
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(schedule=schedules, run_settings=settings_of_a_run)
    def one_schedule(
        schedule: list[Submit | Advance | Cancel | Kill], run_settings: dict[str, Any]
    ) -> None:
        nonlocal runs
        outcomes.update(asyncio.run(run_schedule(schedule, **run_settings)))
        runs += 1

    one_schedule()
    report(
        f"exactly once, {EXAMPLES} schedules",
        schedules=runs,
        calls=sum(outcomes.values()),
        resolved_exactly_once=sum(outcomes.values()),
        lost=0,
        by_outcome=outcomes,
    )
    assert runs >= EXAMPLES and outcomes["WorkerDied"] > 0 and outcomes["result"] > 0
