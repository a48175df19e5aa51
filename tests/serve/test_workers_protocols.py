"""``serve --workers 2`` speaks what one process speaks: streams relayed chunk by
chunk from the hub (a client that leaves frees the item's place), and the
OpenAI-compatible ``/v1/embeddings``; in-process over a real socket pair, then end
to end with httpx streaming and the official openai client."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest

from microbatch import Service, Stage
from microbatch.errors import ItemError, StageFailed
from microbatch.http.metrics import RequestCollector
from microbatch.serve.front import RelayTarget
from microbatch.serve.hub import Hub
from tests.protocols.models import expected_vector
from tests.stream_exchange import check_stream_exchange
from tests.streams.models import Counter

from .test_server import HANG_GUARD_S, running
from .test_workers import _until


@pytest.fixture(autouse=True)
def _fresh_counter() -> Iterator[None]:
    Counter.steps = []
    Counter.gate = None
    yield
    Counter.gate = None


@asynccontextmanager
async def _relayed_streams() -> AsyncIterator[tuple[Service[str, Any], RelayTarget, Hub]]:
    """A service, a hub over it and a front's relay to the hub over a socket pair."""
    service: Service[str, Any] = Service(Stage(Counter, mode="thread", max_batch_size=4))
    await service.start()
    hub = Hub(service)
    ours, theirs = socket.socketpair()
    hello = await hub.connect(0, ours)
    relay = RelayTarget("counter", str, Any, theirs, streaming=[None])
    relay.requests = RequestCollector()
    await relay.start()
    await hello
    try:
        yield service, relay, hub
    finally:
        await relay.close()
        hub.close()
        await service.close()


def _active(service: Service[str, Any]) -> int:
    streams = service.stats().stages[0].streams
    assert streams is not None
    return streams.active


async def _chunks(stream: AsyncIterator[Any]) -> list[Any]:
    return [chunk async for chunk in stream]


async def test_each_relayed_stream_gets_its_own_chunks_in_order() -> None:
    async with _relayed_streams() as (_, relay, _):
        assert relay.can_stream() and not relay.can_stream("other")
        names = [f"s{i}:{1 + i % 4}" for i in range(10)]
        outcomes = await asyncio.gather(*(_chunks(relay.stream(name)) for name in names))
    assert outcomes == [[f"s{i}-{k}" for k in range(1 + i % 4)] for i in range(10)]


async def test_a_relayed_streams_error_is_raised_by_the_front() -> None:
    async with _relayed_streams() as (_, relay, _):
        got: list[Any] = []
        with pytest.raises(ItemError, match="f failed at step 1"):
            async for chunk in relay.stream("f:4:fail@1"):
                got.append(chunk)
    assert got == ["f-0"]


async def test_a_caller_that_leaves_frees_the_items_place() -> None:
    async with _relayed_streams() as (service, relay, _):
        endless = relay.stream("pid")
        assert isinstance(await endless.__anext__(), int)
        await endless.aclose()  # type: ignore[attr-defined]
        # The hub offers no event for it: a bounded wait on its counters.
        await _until(lambda: _active(service) == 0)
        assert await _chunks(relay.stream("b:2")) == ["b-0", "b-1"]


def test_streams_end_to_end_under_workers() -> None:
    with (
        running(
            "tests.streams.served:service", "--workers", "2", "--log-level", "warning"
        ) as server,
        httpx.Client(base_url=server.url, timeout=HANG_GUARD_S) as client,
    ):
        check_stream_exchange(client)
        failed = client.post("/stream", json="f:3:fail@0")
        assert failed.status_code == 422


def test_embeddings_under_workers() -> None:
    with (
        running(
            "tests.protocols.models:embed", "--workers", "2", "--log-level", "warning"
        ) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0) as client,
    ):
        texts = ["hello world", "a second text"]
        reply = client.embeddings.create(model="embed", input=texts)
        for text, datum in zip(texts, reply.data, strict=True):
            assert datum.embedding == pytest.approx(expected_vector(text), abs=1e-6)
        assert [model.id for model in client.models.list()] == ["embed"]


async def test_when_the_hub_goes_an_open_stream_ends_with_503() -> None:
    async with _relayed_streams() as (_, relay, hub):
        endless = relay.stream("pid")
        assert isinstance(await endless.__anext__(), int)
        hub.close()
        with pytest.raises(StageFailed, match="the serving process is gone") as caught:
            async for _ in endless:
                pass
        assert caught.value.http_status == 503
        with pytest.raises(StageFailed):  # a new one fails before its first chunk
            await relay.stream("a:1").__anext__()
