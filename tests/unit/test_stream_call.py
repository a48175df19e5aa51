"""One ModelStreamInfer call's loop (``microbatch.grpc.stream_call``), with plain
requests and answers: concurrency, its two bounds, its end, its errors, and the
requests of a client that leaves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microbatch.grpc.stream_call import Answer, Send, StreamCall


def serve_stream_call(
    requests: AsyncIterator[Any], answer: Answer, *, max_requests: int, max_responses: int
) -> AsyncGenerator[Any, None]:
    call = StreamCall(answer, max_requests=max_requests, max_responses=max_responses)
    return call.responses(requests)


async def _requests(*items: Any, error: Exception | None = None) -> AsyncIterator[Any]:
    for item in items:
        yield item
    if error is not None:
        raise error


async def test_each_request_is_answered_as_soon_as_it_is_ready() -> None:
    async def answer(request: tuple[str, float], send: Send) -> None:
        name, delay = request
        await asyncio.sleep(delay)
        await send(name)

    call = serve_stream_call(
        _requests(("slow", 0.05), ("fast", 0.0), ("middle", 0.02)),
        answer,
        max_requests=8,
        max_responses=8,
    )
    assert [response async for response in call] == ["fast", "middle", "slow"]


async def test_at_most_max_requests_are_in_flight() -> None:
    inside = 0
    most = 0

    async def answer(request: int, send: Send) -> None:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0.001 * (request % 3))
        inside -= 1
        await send(request)

    call = serve_stream_call(_requests(*range(40)), answer, max_requests=3, max_responses=100)
    assert sorted([response async for response in call]) == list(range(40))
    assert most == 3


async def test_at_most_max_responses_wait_to_be_sent() -> None:
    made = 0

    async def answer(request: int, send: Send) -> None:
        nonlocal made
        for chunk in range(10):
            await send((request, chunk))
            made += 1

    call = serve_stream_call(_requests(0, 1, 2), answer, max_requests=8, max_responses=4)
    taken = []
    async for response in call:
        taken.append(response)
        await asyncio.sleep(0)  # a slow client: the answers get every chance to run ahead
        assert made - len(taken) <= 4
    assert sorted(taken) == [(r, c) for r in range(3) for c in range(10)]
    for request in range(3):  # each request's chunks in order
        assert [c for r, c in taken if r == request] == list(range(10))


async def test_an_error_reading_requests_ends_the_call_after_what_was_answered() -> None:
    async def answer(request: int, send: Send) -> None:
        await send(request)

    call = serve_stream_call(
        _requests(1, 2, error=ConnectionError("reset")), answer, max_requests=1, max_responses=8
    )
    taken = []
    with pytest.raises(ConnectionError, match="reset"):
        async for response in call:
            taken.append(response)
    assert taken == [1, 2]


async def test_a_client_that_leaves_cancels_the_requests_in_flight() -> None:
    cancelled: list[int] = []
    started = asyncio.Event()

    async def answer(request: int, send: Send) -> None:
        if request == 0:
            await send("first")
            return
        try:
            started.set()
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(request)
            raise

    call = serve_stream_call(_requests(0, 1, 2), answer, max_requests=8, max_responses=8)
    assert await anext(call) == "first"
    await started.wait()
    await asyncio.sleep(0)
    await call.aclose()
    await asyncio.sleep(0)
    assert sorted(cancelled) == [1, 2]


@st.composite
def _calls(draw: st.DrawFn) -> tuple[list[tuple[int, int | None, int]], int, int, int | None]:
    """Requests (chunks, the chunk it fails at or None, sleeps between chunks in
    loop turns), the two bounds, and after how many responses the client leaves."""
    requests = draw(
        st.lists(
            st.tuples(st.integers(0, 12), st.none() | st.integers(0, 12), st.integers(0, 3)),
            max_size=12,
        )
    )
    leaves = draw(st.none() | st.integers(0, 40))
    return requests, draw(st.integers(1, 6)), draw(st.integers(1, 6)), leaves


@given(_calls())
@settings(max_examples=150, deadline=None)
def test_every_request_gets_exactly_its_own_responses_and_one_end(
    call: tuple[list[tuple[int, int | None, int]], int, int, int | None],
) -> None:
    requests, max_requests, max_responses, leaves = call

    async def answer(request: int, send: Send) -> None:
        chunks, fails_at, turns = requests[request]
        try:
            for position in range(chunks):
                for _ in range(turns):
                    await asyncio.sleep(0)
                if position == fails_at:
                    raise ValueError(f"{request} failed")
                await send((request, "chunk", position))
            await send((request, "end", None))
        except ValueError as error:
            await send((request, "error", str(error)))

    async def run() -> tuple[list[Any], set[asyncio.Task[Any]]]:
        before = asyncio.all_tasks()
        responses = serve_stream_call(
            _requests(*range(len(requests))),
            answer,
            max_requests=max_requests,
            max_responses=max_responses,
        )
        taken: list[Any] = []
        async for response in responses:
            taken.append(response)
            if leaves is not None and len(taken) >= leaves:
                break
        await responses.aclose()
        for _ in range(3):
            await asyncio.sleep(0)
        ours = {  # the call's reader and answers (not the loop's generator finalizers)
            task
            for task in asyncio.all_tasks() - before
            if "StreamCall" in getattr(task.get_coro(), "__qualname__", "")
        }
        return taken, {task for task in ours if not task.done()}

    taken, left_running = asyncio.run(run())
    assert not left_running
    for request, (chunks, fails_at, _) in enumerate(requests):
        own = [(kind, value) for r, kind, value in taken if r == request]
        made = chunks if fails_at is None or fails_at >= chunks else fails_at
        expected: list[tuple[str, Any]] = [("chunk", position) for position in range(made)]
        expected.append(("end", None) if made == chunks else ("error", f"{request} failed"))
        assert own == expected[: len(own)]  # its own, in order, nothing after its end
        if leaves is None:
            assert own == expected  # a client that stays gets everything
