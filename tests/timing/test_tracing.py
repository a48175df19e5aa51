"""Issue 19, traces: a span per request (a child of the caller's ``traceparent``), a
child span per stage, and one span per batch linked to the request span of every
item in it, checked with the OpenTelemetry SDK's in-memory exporter under
concurrency."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from microbatch.http import HttpApp, HttpConfig
from microbatch.tracing import Tracer
from tests.http import models
from tests.http.conftest import serving
from tests.timing.models import triple

REQUESTS = 24


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    yield spans
    spans.shutdown()


def tracer_to(exporter: InMemorySpanExporter) -> Tracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracer(provider.get_tracer("test"))


def traceparent(index: int) -> tuple[str, int, int]:
    """A distinct W3C ``traceparent`` per request, with its trace and parent ids."""
    trace_id, parent_id = 0xA0000 + index, 0xB000 + index
    return f"00-{trace_id:032x}-{parent_id:016x}-01", trace_id, parent_id


async def post_concurrently(app: HttpApp) -> list[tuple[int, int]]:
    """Post REQUESTS items at once, each under its own trace; their (trace, parent) ids."""
    sent = [traceparent(i) for i in range(REQUESTS)]
    async with serving(app) as client:
        replies = await asyncio.gather(
            *(
                client.post("/predict", json={"x": i + 0.5}, headers={"traceparent": header})
                for i, (header, _, _) in enumerate(sent)
            )
        )
    assert [reply.status_code for reply in replies] == [200] * REQUESTS
    return [(trace_id, parent_id) for _, trace_id, parent_id in sent]


def check_trace(spans: list[ReadableSpan], sent: list[tuple[int, int]], stages: list[str]) -> None:
    requests = [span for span in spans if span.name == "POST /predict"]
    assert len(requests) == REQUESTS
    by_trace = {span.context.trace_id: span for span in requests}
    for trace_id, parent_id in sent:  # each request a child of its caller's span
        request = by_trace[trace_id]
        assert request.parent is not None and request.parent.span_id == parent_id
    request_ids = {span.context.span_id for span in requests}
    batches = {span.context.span_id: span for span in spans if span.name.startswith("batch ")}
    for stage in stages:
        stage_spans = [span for span in spans if span.name == stage]
        assert len(stage_spans) == REQUESTS  # one per request and stage
        linked: Counter[int] = Counter()
        stage_batches = [b for b in batches.values() if b.name == f"batch {stage}"]
        for batch in stage_batches:
            assert batch.parent is None  # a root: it serves many traces
            assert batch.attributes is not None
            assert batch.attributes["microbatch.batch.size"] == len(batch.links)
            for link in batch.links:
                linked[link.context.span_id] += 1
        assert set(linked) == request_ids and set(linked.values()) == {1}
        assert sum(len(b.links) for b in stage_batches) == REQUESTS
        for span in stage_spans:
            assert span.parent is not None and span.parent.span_id in request_ids
            request = next(r for r in requests if r.context.span_id == span.parent.span_id)
            assert span.context.trace_id == request.context.trace_id
            (link,) = span.links  # to its batch, which links back to its request
            batch = batches[link.context.span_id]
            assert batch.name == f"batch {stage}"
            assert request.context.span_id in {lk.context.span_id for lk in batch.links}
            assert batch.start_time is not None and request.start_time is not None
            assert span.start_time is not None and span.end_time is not None
            assert request.start_time <= span.start_time <= batch.start_time
    assert max(len(b.links) for b in batches.values()) > 1  # concurrent items batched


async def test_batched_function_requests_link_to_their_batches(
    exporter: InMemorySpanExporter,
) -> None:
    sent = await post_concurrently(HttpApp(models.double, tracer=tracer_to(exporter)))
    check_trace(list(exporter.get_finished_spans()), sent, ["double"])


async def test_a_thread_batched_function_is_traced_the_same_way(
    exporter: InMemorySpanExporter,
) -> None:
    sent = await post_concurrently(HttpApp(triple, tracer=tracer_to(exporter)))
    check_trace(list(exporter.get_finished_spans()), sent, ["triple"])


async def test_every_stage_of_a_pipeline_is_a_child_span(exporter: InMemorySpanExporter) -> None:
    app = HttpApp(
        models.make_two_stages(), HttpConfig(server_timing=False), tracer=tracer_to(exporter)
    )
    sent = await post_concurrently(app)
    check_trace(list(exporter.get_finished_spans()), sent, ["Double", "Describe"])


async def test_batches_in_worker_processes_are_traced_from_their_reported_times(
    exporter: InMemorySpanExporter,
) -> None:
    sent = await post_concurrently(HttpApp(models.service, tracer=tracer_to(exporter)))
    spans = list(exporter.get_finished_spans())
    check_trace(spans, sent, ["Double"])
    for batch in (span for span in spans if span.name == "batch Double"):
        assert batch.start_time is not None and batch.end_time is not None
        assert batch.end_time - batch.start_time >= 2_000_000  # the worker's model sleeps 2 ms


async def test_a_failed_request_ends_its_span_with_the_error(
    exporter: InMemorySpanExporter,
) -> None:
    async with serving(HttpApp(models.double, tracer=tracer_to(exporter))) as client:
        reply = await client.post("/predict", json={"x": 13.0})
    assert reply.status_code == 500
    (request,) = [s for s in exporter.get_finished_spans() if s.name == "POST /predict"]
    assert not request.status.is_ok and request.parent is None
