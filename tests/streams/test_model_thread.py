"""The thread a step model runs in: calls run there one at a time, in order, and
each answers (result or error) on its future in the calling event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

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
