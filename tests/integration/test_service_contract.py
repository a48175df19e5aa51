"""A Service as the one contract (Servable): routes, restarts, item errors, types."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

import microbatch
from microbatch import BatcherClosed, Service, Stage
from microbatch.errors import ItemError
from microbatch.http import app
from microbatch.types import Route, Servable
from tests.http.conftest import serving
from tests.integration.contract_models import RefusesNegatives
from tests.integration.pipeline_models import AddOne, Square
from tests.integration.pool_models import Gate, Gated
from tests.streams.models import Counter

pytestmark = pytest.mark.timeout(120)


def _check_servable(servable: Servable[int, int]) -> Servable[int, int]:
    return servable


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_a_service_starts_again_after_it_closed(mode: str) -> None:
    service: Service[int, int] = Service(Stage(AddOne, mode=mode), Stage(Square, mode=mode))
    assert not service.ready and service.stats().stages[0].batching.items == 0
    with pytest.raises(BatcherClosed, match="not started"):
        await service.submit(1)
    async with service:
        assert await service.submit(1) == 4
    assert not service.ready
    async with service:  # fresh workers, same definition
        assert await asyncio.gather(*(service.submit(x) for x in range(5))) == [
            (x + 1) ** 2 for x in range(5)
        ]
        with pytest.raises(RuntimeError, match="running already"):
            await service.start()
    assert not service.ready


async def test_the_service_declares_its_types_routes_and_examples() -> None:
    service = _check_servable(
        Service(Stage(AddOne, mode="thread"), Stage(Square, mode="thread"), examples=[3])
    )
    assert (service.name, service.input_type, service.output_type) == ("Square", int, int)
    assert dict(service.routes) == {
        "AddOne": Route(int, int),
        "Square": Route(int, int),
    }
    assert list(service.examples) == [3]
    async with service:
        assert await service.submit(3, route="Square") == 9
        with pytest.raises(KeyError, match="no route 'Cube'"):
            await service.submit(3, route="Cube")


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_an_item_error_fails_its_own_item_with_its_status(mode: str) -> None:
    service = Service(Stage(RefusesNegatives, mode=mode, max_batch_size=8))
    async with service:
        outcomes = await asyncio.gather(
            *(service.submit(x) for x in (1, -2, 13, 4)), return_exceptions=True
        )
    assert outcomes[0] == 2 and outcomes[3] == 8
    assert isinstance(outcomes[1], ItemError) and outcomes[1].http_status == 422
    assert str(outcomes[1]) == "-2 is negative"
    assert isinstance(outcomes[2], ItemError) and outcomes[2].http_status == 400


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_an_item_error_is_the_http_answer(mode: str) -> None:
    service = Service(Stage(RefusesNegatives, mode=mode))
    async with serving(app(service)) as client:
        replies: list[httpx.Response] = await asyncio.gather(
            *(client.post("/predict", json=x) for x in (5, -1, 13))
        )
    assert [r.status_code for r in replies] == [200, 422, 400]
    assert replies[1].json()["error"] == "ItemError"
    assert replies[1].json()["message"] == "-1 is negative"
    assert replies[2].json()["message"] == "13 is unlucky"


async def test_an_item_error_from_a_batched_function_is_the_http_answer() -> None:
    @microbatch.batch(max_batch_size=4)
    async def refuse(xs: list[int]) -> list[int | ItemError]:
        return [ItemError("no odd numbers", status=409) if x % 2 else x for x in xs]

    async with serving(app(refuse)) as client:
        odd, even = await asyncio.gather(
            client.post("/predict", json=3), client.post("/predict", json=4)
        )
    assert (odd.status_code, odd.json()["message"], even.json()) == (409, "no odd numbers", 4)


@asynccontextmanager
async def _released_at_exit(gate: Gate) -> AsyncIterator[None]:
    """Let a held batch go however the block ends, so that a failure cannot hang."""
    try:
        yield
    finally:
        gate.release(2)


async def _turns(count: int) -> None:
    """Let the event loop run ``count`` turns (hand-over, pipe writes)."""
    for _ in range(count):
        await asyncio.sleep(0)


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_a_caller_that_leaves_while_its_batch_waits_at_a_busy_worker_is_not_computed(
    gate: Gate, mode: str
) -> None:
    # Batches go when full (3 items): the first holds the worker, the second is
    # handed over behind it at once.
    stage = Stage(
        Gated, args=gate.args, mode=mode, max_batch_size=3, policy="fixed", max_latency_ms=60_000
    )
    service = Service(stage)
    async with service, _released_at_exit(gate):
        held = asyncio.gather(*(service.submit(-1) for _ in range(3)))
        await gate.started()  # the worker runs a batch of [-1, -1, -1] and holds it
        calls = [asyncio.create_task(service.submit(x)) for x in (2, 3, 4)]
        await _turns(5)  # a full batch goes to the busy worker at once, behind [-1]
        assert service.stats().stages[0].batching.queued == 0
        calls[1].cancel()
        await _turns(5)  # the pool tells the worker
        gate.release()
        assert await held == [(-1, (-1, -1, -1))] * 3
        results = await asyncio.gather(*calls, return_exceptions=True)
        cancelled = service.stats().stages[0].batching.cancelled
    assert results[0] == (2, (2, 4)) and results[2] == (4, (2, 4))  # 3 never computed
    assert isinstance(results[1], asyncio.CancelledError)
    assert cancelled == 0  # it had left the queue: the worker left it out


async def test_submit_nowait_queues_one_stage_routes_and_counts_in_flight() -> None:
    service: Service[int, int] = Service(Stage(AddOne, mode="thread"), Stage(Square, mode="thread"))
    with pytest.raises(BatcherClosed, match="not started"):
        service.submit_nowait(1)
    async with service:
        assert service.submit_nowait(1) is None  # two stages: submit() carries it
        future = service.submit_nowait(3, route="Square")
        assert future is not None
        assert service.stats().in_flight == 1
        assert await future == 9
        await asyncio.sleep(0)  # the done callbacks run
        assert service.stats().in_flight == 0
        withdrawn = service.submit_nowait(4, route="AddOne")
        assert withdrawn is not None
        withdrawn.cancel()
        await asyncio.sleep(0)
        assert service.stats().in_flight == 0
        assert await service.submit(5) == 36


class _Held(microbatch.Model):
    """Holds each batch until the test releases it."""

    release = threading.Event()

    def predict(self, batch: list[int]) -> list[int]:
        _Held.release.wait(30)
        return batch


async def test_submit_nowait_refuses_at_once_as_submit_does() -> None:
    _Held.release.clear()
    service: Service[int, int] = Service(Stage(_Held, mode="thread"), max_in_flight=1)
    async with service:
        held = service.submit_nowait(1)
        assert held is not None and service.stats().in_flight == 1
        with pytest.raises(microbatch.Overloaded):
            service.submit_nowait(2)  # the bound: refused, nothing queued
        with pytest.raises(microbatch.Overloaded):
            await service.submit(2)
        _Held.release.set()
        assert await held == 1
        await asyncio.sleep(0)  # the done callbacks run
        assert service.stats().in_flight == 0
        again = service.submit_nowait(3)
        assert again is not None and await again == 3
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(service.close())
        await asyncio.sleep(0)
        with pytest.raises(BatcherClosed, match="shutting down"):
            service.submit_nowait(4)
        await closing
    assert service.stats().in_flight == 0


async def test_stream_refuses_at_once_and_counts_each_stream_out_once() -> None:
    service: Service[str, str] = Service(Stage(Counter, mode="thread"), max_in_flight=2)
    async with service:
        first = service.stream("a:2")  # a one-stage route opens through its lane
        second = service.stream("b:3", timeout_s=30)  # the lane too, with a deadline
        assert service.stats().in_flight == 2
        with pytest.raises(microbatch.Overloaded):
            service.stream("c:1")  # the bound: refused, nothing opened
        assert [chunk async for chunk in first] == ["a-0", "a-1"]
        assert [chunk async for chunk in second] == ["b-0", "b-1", "b-2"]
        assert service.stats().in_flight == 0
        left = service.stream("d:100")
        assert await left.__anext__() == "d-0"
        await left.aclose()  # a caller who leaves is counted out too
        assert service.stats().in_flight == 0
        closing = asyncio.ensure_future(service.close())
        await asyncio.sleep(0)
        with pytest.raises(BatcherClosed, match="shutting down"):
            service.stream("e:1")
        await closing
    assert service.stats().in_flight == 0
    with pytest.raises(BatcherClosed):
        service.stream("f:1")  # closed: its lanes are gone with its stages
