"""Issue 19, traces through Ray replicas: :class:`~microbatch.ray.ServiceClient` sends
the caller's current span along (its W3C ``traceparent``) and a replica that traces
makes the item's span a child of it, with the stage spans and batch links below.
Unit tests of the carrying code, without a Ray cluster (a handle that records its
calls; the replica's ``submit`` on an app in this process)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from microbatch.http import HttpApp
from microbatch.ray import ServiceClient
from microbatch.ray.replica import Replica
from microbatch.tracing import Tracer, current_traceparent
from tests.http import models
from tests.http.conftest import lifespan

ITEMS = 8
HANG_GUARD_S = 60.0


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    yield spans
    spans.shutdown()


def provider_to(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


class RecordingHandle:
    """A ``DeploymentHandle`` stand-in: ``submit.remote(...)`` records its arguments
    and answers ``2 * item`` at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.submit = self

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        self.calls.append(args)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        answer.set_result(2 * args[0])
        return answer


async def test_the_client_sends_the_callers_current_span_along(
    exporter: InMemorySpanExporter,
) -> None:
    handle = RecordingHandle()
    client = ServiceClient(handle)
    assert await client.submit(1) == 2
    tracer = provider_to(exporter).get_tracer("caller")
    with tracer.start_as_current_span("caller") as span:
        assert await client.submit(2, timeout_s=3.0) == 4
        expected = current_traceparent()
    context = span.get_span_context()
    assert expected.startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
    assert handle.calls == [(1, None, ""), (2, 3.0, expected)]  # none without a span
    assert current_traceparent() == ""


class ReplicaCode:
    """The replica class's ``submit`` over ``app``, without a Ray actor (Ray builds
    the app from the recipe in the replica; here the test's app, with the test's
    tracer)."""

    def __init__(self, app: HttpApp) -> None:
        self._http = app

    deadline = Replica.deadline

    async def submit(self, item: Any, timeout_s: float | None = None, traceparent: str = "") -> Any:
        return await Replica.submit(self, item, timeout_s, traceparent)  # type: ignore[arg-type]


async def test_a_tracing_replica_makes_each_item_a_child_of_the_callers_span(
    exporter: InMemorySpanExporter,
) -> None:
    provider = provider_to(exporter)
    app = HttpApp(models.double, tracer=Tracer(provider.get_tracer("replica")))
    replica = ReplicaCode(app)
    caller = provider.get_tracer("caller")
    sent: list[tuple[int, int]] = []
    async with lifespan(app):
        calls = []
        for index in range(ITEMS):
            with caller.start_as_current_span(f"caller {index}") as span:
                context = span.get_span_context()
                sent.append((context.trace_id, context.span_id))
                point = models.Point(index + 0.5)
                calls.append(replica.submit(point, 5.0, current_traceparent()))
        results = await asyncio.wait_for(asyncio.gather(*calls), HANG_GUARD_S)
        untraced = await asyncio.wait_for(replica.submit(models.Point(1.0)), HANG_GUARD_S)
    assert [result.y for result in results] == [2 * (i + 0.5) for i in range(ITEMS)]
    assert untraced.y == 2.0
    spans = list(exporter.get_finished_spans())
    items = [span for span in spans if span.name == "microbatch replica"]
    assert len(items) == ITEMS  # the item without a traceparent makes no span
    by_trace = {span.context.trace_id: span for span in items}
    for trace_id, caller_span in sent:
        item = by_trace[trace_id]
        assert item.parent is not None and item.parent.span_id == caller_span
    item_ids = {span.context.span_id for span in items}
    stages = [span for span in spans if span.name == "double"]
    assert len(stages) == ITEMS
    batches = {span.context.span_id: span for span in spans if span.name == "batch double"}
    for stage in stages:
        assert stage.parent is not None and stage.parent.span_id in item_ids
        (link,) = stage.links
        assert stage.parent.span_id in {
            lk.context.span_id for lk in batches[link.context.span_id].links
        }
    assert max(len(batch.links) for batch in batches.values()) > 1  # items shared batches
