"""The thread a step model runs in: calls run there one at a time, in order, and
each answers (result or error) on its future in the calling event loop; a step
call to an idle thread is timed, and handed the GIL when its chooser says so."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

import pytest

from microbatch.pipeline import model_thread
from microbatch.pipeline.gil_handoff import GilHandoff
from microbatch.pipeline.model_thread import ModelThread

BOUND_S = 20.0


async def test_calls_run_in_one_thread_in_order_and_answer_in_the_loop() -> None:
    thread = ModelThread("test-model")
    ran: list[tuple[int, str]] = []

    def work(index: int) -> int:
        ran.append((index, threading.current_thread().name))
        return index * 10

    futures = [thread.call(work, index) for index in range(5)]
    results = await asyncio.wait_for(asyncio.gather(*futures), BOUND_S)
    await asyncio.wait_for(thread.close(), BOUND_S)
    assert results == [0, 10, 20, 30, 40]
    assert [index for index, _ in ran] == [0, 1, 2, 3, 4]
    assert {name for _, name in ran} == {"test-model"}


async def test_an_error_comes_on_its_future_and_the_thread_goes_on() -> None:
    thread = ModelThread("test-model")

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await asyncio.wait_for(thread.call(fail), BOUND_S)
    assert await asyncio.wait_for(thread.call(len, "abc"), BOUND_S) == 3
    await asyncio.wait_for(thread.close(), BOUND_S)


async def test_close_lets_queued_calls_finish_then_refuses_new_ones() -> None:
    thread = ModelThread("test-model")
    gate = threading.Event()
    held = thread.call(gate.wait, BOUND_S)
    queued = thread.call(len, "ab")
    closing = asyncio.ensure_future(thread.close())
    await asyncio.sleep(0)
    gate.set()
    await asyncio.wait_for(closing, BOUND_S)
    assert await held is True and await queued == 2
    with pytest.raises(RuntimeError, match="closed"):
        await thread.call(len, "x")
    assert not any(t.name == "test-model" for t in threading.enumerate())


async def test_an_answer_whose_caller_stopped_waiting_is_dropped() -> None:
    thread = ModelThread("test-model")
    gate = threading.Event()
    held = thread.call(gate.wait, BOUND_S)
    held.cancel()
    gate.set()
    assert await asyncio.wait_for(thread.call(len, "abc"), BOUND_S) == 3  # still serving
    await asyncio.wait_for(thread.close(), BOUND_S)
    assert held.cancelled()


class _Recording(GilHandoff):
    """Always the way it is told; remembers the round trips it is told."""

    def __init__(self, handing: bool) -> None:
        super().__init__()
        self.handing = handing
        self.seen: list[tuple[bool, float]] = []

    def choose(self) -> bool:
        return self.handing

    def observe(self, handed: bool, seconds: float) -> None:
        self.seen.append((handed, seconds))


class _CountedQueue(queue.SimpleQueue):  # type: ignore[type-arg]
    """Releases ``gets`` each time the thread asks for its next call."""

    def __init__(self, gets: threading.Semaphore) -> None:
        self.gets = gets

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        self.gets.release()
        return super().get(block, timeout)


async def _idle_thread() -> tuple[ModelThread, _CountedQueue]:
    """A thread that answered one call and waits for the next."""
    thread = ModelThread("test-model")
    calls = thread._calls = _CountedQueue(threading.Semaphore(0))
    assert await asyncio.wait_for(thread.call(len, "a"), BOUND_S) == 1
    for _ in range(2):  # it asked for the first call, then for the next
        assert await asyncio.to_thread(calls.gets.acquire, True, BOUND_S)
    return thread, calls


@pytest.mark.parametrize("handing", [True, False])
async def test_a_step_to_an_idle_thread_is_timed_and_handed_over_when_chosen(
    handing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_thread, "_HANDOFF_WAIT_S", BOUND_S)  # however slow the machine
    thread, calls = await _idle_thread()
    thread.handoff = recording = _Recording(handing)
    answer = thread.call_now(len, "abc")
    if handing:
        assert calls.empty()  # taken by the thread before call_now returned
    assert await asyncio.wait_for(answer, BOUND_S) == 3
    await asyncio.wait_for(thread.close(), BOUND_S)
    assert [handed for handed, _ in recording.seen] == [handing]
    assert recording.seen[0][1] >= 0


async def test_a_step_behind_a_running_call_is_neither_handed_over_nor_timed() -> None:
    thread, _ = await _idle_thread()
    thread.handoff = recording = _Recording(True)
    gate = threading.Event()
    held = thread.call(gate.wait, BOUND_S)
    behind = thread.call_now(len, "ab")
    gate.set()
    assert await asyncio.wait_for(held, BOUND_S) is True
    assert await asyncio.wait_for(behind, BOUND_S) == 2
    await asyncio.wait_for(thread.close(), BOUND_S)
    assert recording.seen == []
