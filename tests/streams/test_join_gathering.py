"""``Stage(min_joiners=..., max_join_wait_ms=...)``: a step model whose start costs
about a step whatever it starts has its queued items gathered into fewer starts,
through a real Service (the loop's own rules are property-tested on a fake clock in
``test_step_admission.py``)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from microbatch import Service, Stage, StepModel

HANG_GUARD_S = 30.0


class Recorded(StepModel):
    """Item ``"name:n"``: n chunks; every start's items are recorded."""

    starts: list[list[str]] = []  # noqa: RUF012 - the items of each start (thread mode)
    lock = threading.Lock()

    def start(self, items: list[str]) -> list[list[Any]]:
        with self.lock:
            type(self).starts.append(list(items))
        return [[item.split(":")[0], int(item.split(":")[1]), 0] for item in items]

    def step(self, states: list[list[Any]]) -> tuple[list[str], list[bool]]:
        for state in states:
            state[2] += 1
        return [f"{s[0]}-{s[2]}" for s in states], [s[2] >= s[1] for s in states]


async def _starts(stage: Stage) -> list[list[str]]:
    """Open a long stream, then three joiners one at a time while it steps; the
    items of each start."""
    Recorded.starts = []
    async with Service(stage) as service:
        long = service.stream("long:100000")
        await anext(long)
        readers = []
        for name in ("a", "b", "c"):
            readers.append(asyncio.ensure_future(_all(service.stream(f"{name}:2"))))
            for _ in range(3):  # the long stream steps between two openings
                await anext(long)
        done = await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD_S)
        await long.aclose()
    assert done == [[f"{name}-1", f"{name}-2"] for name in "abc"]
    return Recorded.starts


async def _all(stream: Any) -> list[str]:
    return [chunk async for chunk in stream]


async def test_joiners_start_one_at_a_time_by_default() -> None:
    starts = await _starts(Stage(Recorded, mode="thread", max_batch_size=8))
    assert starts == [["long:100000"], ["a:2"], ["b:2"], ["c:2"]]


async def test_gathered_joiners_start_together() -> None:
    stage = Stage(Recorded, mode="thread", max_batch_size=8, min_joiners=3, max_join_wait_ms=60_000)
    starts = await _starts(stage)
    assert starts == [["long:100000"], ["a:2", "b:2", "c:2"]]


async def test_a_lone_joiner_starts_after_max_join_wait_ms() -> None:
    stage = Stage(Recorded, mode="thread", max_batch_size=8, min_joiners=8, max_join_wait_ms=5)
    Recorded.starts = []
    async with Service(stage) as service:
        long = service.stream("long:100000")
        await anext(long)
        stepped = 0

        async def read_long() -> None:
            nonlocal stepped
            async for _ in long:
                stepped += 1

        reading = asyncio.ensure_future(read_long())
        opened = time.monotonic()
        joiner = service.stream("a:2")
        first = await asyncio.wait_for(anext(joiner), HANG_GUARD_S)
        waited_s = time.monotonic() - opened
        steps_before = stepped
        rest = await asyncio.wait_for(_all(joiner), HANG_GUARD_S)
        reading.cancel()
    assert [first, *rest] == ["a-1", "a-2"]
    assert Recorded.starts == [["long:100000"], ["a:2"]]
    assert waited_s >= 0.005  # it waited for company while the long stream stepped
    assert steps_before > 0


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"min_joiners": 0}, "min_joiners"),
        ({"min_joiners": True}, "min_joiners"),
        ({"min_joiners": 2.0}, "min_joiners"),
        ({"max_join_wait_ms": -1}, "max_join_wait_ms"),
        ({"max_join_wait_ms": float("inf")}, "max_join_wait_ms"),
        ({"max_join_wait_ms": "5"}, "max_join_wait_ms"),
    ],
)
def test_bad_gathering_settings_are_refused(given: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Stage(Recorded, mode="thread", **given)
