"""Issue 19, traces of streams: a span per stream (``POST /stream``, a child of the
caller's ``traceparent``) with an event at its first chunk, its number of chunks,
and its end: complete, the stream's error, or refused before it started."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from microbatch import Service, Stage
from microbatch.http import HttpApp
from tests.http.conftest import serving
from tests.streams.models import Counter
from tests.timing.test_tracing import traceparent, tracer_to

STREAMS = 6
HANG_GUARD_S = 60.0


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    yield spans
    spans.shutdown()


@pytest.fixture(autouse=True)
def _fresh_counter() -> Iterator[None]:
    Counter.gate = None
    yield
    if Counter.gate is not None:
        Counter.gate.set()
    Counter.gate = None


def counter_app(exporter: InMemorySpanExporter, max_queue: int = 64) -> HttpApp:
    service = Service(Stage(Counter, mode="thread", max_batch_size=4, max_queue=max_queue))
    return HttpApp(service, tracer=tracer_to(exporter))


async def test_each_stream_is_a_span_under_its_callers_traceparent(
    exporter: InMemorySpanExporter,
) -> None:
    sent = [traceparent(index) for index in range(STREAMS)]
    async with serving(counter_app(exporter)) as client:
        replies = await asyncio.wait_for(
            asyncio.gather(
                *(
                    client.post(
                        "/stream",
                        json=f"s{index}:{index + 1}",
                        headers={"accept": "application/x-ndjson", "traceparent": header},
                    )
                    for index, (header, _, _) in enumerate(sent)
                ),
                client.post(
                    "/stream", json="bad:3:fail@1", headers={"accept": "application/x-ndjson"}
                ),
            ),
            HANG_GUARD_S,
        )
    assert [reply.status_code for reply in replies] == [200] * (STREAMS + 1)
    spans = [span for span in exporter.get_finished_spans() if span.name == "POST /stream"]
    assert len(spans) == STREAMS + 1
    by_trace = {span.context.trace_id: span for span in spans}
    for index, (_, trace_id, parent_id) in enumerate(sent):
        span = by_trace[trace_id]
        assert span.parent is not None and span.parent.span_id == parent_id
        assert span.attributes is not None
        assert span.attributes["microbatch.stream.chunks"] == index + 1
        assert span.status.is_ok
        (event,) = span.events
        assert event.name == "first chunk" and event.attributes is not None
        assert event.attributes["microbatch.first_chunk_ms"] >= 0
    (failed,) = [span for span in spans if span.parent is None]
    assert failed.attributes is not None and failed.attributes["microbatch.stream.chunks"] == 1
    assert not failed.status.is_ok  # its error came as the final message


async def test_a_refused_stream_ends_its_span_with_the_error(
    exporter: InMemorySpanExporter,
) -> None:
    Counter.gate = gate = threading.Event()
    async with serving(counter_app(exporter, max_queue=1)) as client:
        headers = {"accept": "application/x-ndjson"}
        held = [
            asyncio.ensure_future(client.post("/stream", json=f"h{i}:1", headers=headers))
            for i in range(6)  # 4 stepped (held at the gate), 1 waiting, the rest refused
        ]
        # while the gate is shut, only a refused stream can be answered
        done, _ = await asyncio.wait(
            held, timeout=HANG_GUARD_S, return_when=asyncio.FIRST_COMPLETED
        )
        assert done and all(task.result().status_code == 503 for task in done)
        gate.set()
        replies = await asyncio.wait_for(asyncio.gather(*held), HANG_GUARD_S)
    statuses = sorted(reply.status_code for reply in replies)
    assert 503 in statuses and 200 in statuses
    spans = [span for span in exporter.get_finished_spans() if span.name == "POST /stream"]
    assert len(spans) == len(replies)
    errors = [span for span in spans if not span.status.is_ok]
    assert len(errors) == statuses.count(503)
    for span in errors:
        assert span.attributes is not None and span.attributes["microbatch.stream.chunks"] == 0
