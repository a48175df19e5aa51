"""Issue 19, traces of streams: a span per stream (``POST /stream``, a child of the
caller's ``traceparent``) with an event at its first chunk, its number of chunks,
and its end: complete, the stream's error, or refused before it started; and a
span per step of step-wise batching, linked to the spans of the streams it
stepped (as a batch's span to its requests')."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from microbatch import Service, Stage
from microbatch.http import HttpApp
from tests.http.conftest import serving, serving_natively
from tests.streams.models import Counter, Name
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


def traced_streams(client: Any, sent: list[tuple[str, int, int]]) -> list[Any]:
    """One stream request per ``traceparent`` in ``sent``: stream ``index`` is
    ``"s{index}:{index + 1}"`` (index + 1 chunks, one per step)."""
    return [
        client.post(
            "/stream",
            json=f"s{index}:{index + 1}",
            headers={"accept": "application/x-ndjson", "traceparent": header},
        )
        for index, (header, _, _) in enumerate(sent)
    ]


async def test_each_stream_is_a_span_under_its_callers_traceparent(
    exporter: InMemorySpanExporter,
) -> None:
    sent = [traceparent(index) for index in range(STREAMS)]
    async with serving(counter_app(exporter)) as client:
        untraced = client.post(
            "/stream", json="bad:3:fail@1", headers={"accept": "application/x-ndjson"}
        )
        replies = await asyncio.wait_for(
            asyncio.gather(*traced_streams(client, sent), untraced), HANG_GUARD_S
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


async def collect(chunks: AsyncIterator[Any]) -> list[Any]:
    """Every chunk of a stream."""
    return [chunk async for chunk in chunks]


STEP_SPAN = "step of stage 'Counter'"


def step_links(spans: tuple[ReadableSpan, ...]) -> dict[int, int]:
    """How many spans of the ``Counter`` stage's steps link to each span id; each
    checked to be a root of its own that links to no more streams than it stepped."""
    linked: dict[int, int] = {}
    steps = [span for span in spans if span.name == STEP_SPAN]
    assert steps
    for step in steps:
        assert step.parent is None  # it serves many traces
        assert step.attributes is not None
        assert step.attributes["microbatch.step_loop"] == "stage 'Counter'"
        assert 1 <= len(step.links) <= step.attributes["microbatch.step.size"]
        assert (
            0
            <= step.attributes["microbatch.step.joined"]
            <= step.attributes["microbatch.step.size"]
        )
        assert step.start_time is not None and step.end_time is not None
        assert step.start_time <= step.end_time
        for link in step.links:
            linked[link.context.span_id] = linked.get(link.context.span_id, 0) + 1
    return linked


async def test_each_step_is_a_span_linked_to_the_streams_it_stepped(
    exporter: InMemorySpanExporter,
) -> None:
    sent = [traceparent(index) for index in range(STREAMS)]
    async with serving(counter_app(exporter)) as client:
        replies = await asyncio.wait_for(
            asyncio.gather(*traced_streams(client, sent)), HANG_GUARD_S
        )
    assert [reply.status_code for reply in replies] == [200] * STREAMS
    spans = exporter.get_finished_spans()
    linked = step_links(spans)
    streams = {span.context.trace_id: span for span in spans if span.name == "POST /stream"}
    for index, (_, trace_id, _) in enumerate(sent):
        # "s{index}:{index + 1}" makes one chunk per step: index + 1 steps serve it
        assert linked.pop(streams[trace_id].context.span_id) == index + 1
    assert not linked  # the steps link to these streams only
    joined = sum(
        span.attributes["microbatch.step.joined"]
        for span in spans
        if span.name == STEP_SPAN and span.attributes is not None
    )
    assert joined == STREAMS


async def test_a_pipelines_steps_link_to_its_streams_and_untraced_steps_make_no_span(
    exporter: InMemorySpanExporter,
) -> None:
    pipeline = Service(Stage(Name, mode="thread"), Stage(Counter, mode="thread"))
    async with serving(HttpApp(pipeline, tracer=tracer_to(exporter))) as client:
        whole = await asyncio.wait_for(
            client.post("/stream", json=3, headers={"accept": "application/x-ndjson"}),
            HANG_GUARD_S,
        )
        assert whole.status_code == 200
        spans = exporter.get_finished_spans()
        (stream,) = [span for span in spans if span.name == "POST /stream"]
        # the steps of the stage opened after the one-shot stage's batch link to it
        assert step_links(spans) == {stream.context.span_id: 3}
        exporter.clear()
        chunks = await asyncio.wait_for(collect(pipeline.stream(2)), HANG_GUARD_S)  # untraced
    assert chunks == ["item2-0", "item2-1"]
    assert not [span for span in exporter.get_finished_spans() if span.name == STEP_SPAN]


def _spelling(exporter: InMemorySpanExporter) -> HttpApp:
    """An app over a text generator that spells its prompts, tracing to ``exporter``."""
    from microbatch.http import CompletionModel
    from tests.protocols.models import Speller

    service = Service(Stage(Speller, mode="thread", max_batch_size=4), name="spell")
    service.completion_model = CompletionModel()  # type: ignore[attr-defined]
    return HttpApp(service, tracer=tracer_to(exporter))


async def _completed(client: Any, body: dict[str, Any], header: str) -> Any:
    return await asyncio.wait_for(
        client.post("/v1/completions", json=body, headers={"traceparent": header}),
        HANG_GUARD_S,
    )


async def test_each_choice_of_a_completion_is_a_stream_span(
    exporter: InMemorySpanExporter,
) -> None:
    header, trace_id, parent_id = traceparent(0)
    body = {"model": "spell", "prompt": ["abc", "xyz"], "max_tokens": 5, "stop": "y"}
    async with serving(_spelling(exporter)) as client:
        reply = await _completed(client, body, header)
    assert reply.status_code == 200
    assert [choice["text"] for choice in reply.json()["choices"]] == ["abcab", "x"]
    spans = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/completions"]
    assert len(spans) == 2
    for span in spans:
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == parent_id
    chunks = sorted(dict(span.attributes or {})["microbatch.stream.chunks"] for span in spans)
    assert chunks == [2, 5]  # "x", "y" (the stop: the stream is left) and "abcab"


async def test_a_streamed_completion_of_a_traced_app_keeps_its_span_on_the_connection_layer(
    exporter: InMemorySpanExporter,
) -> None:
    # The connection layer leaves a traced app's completions to its ASGI route,
    # where each choice's stream gets its span.
    header, trace_id, parent_id = traceparent(1)
    body = {"model": "spell", "prompt": "abc", "max_tokens": 4, "stream": True}
    async with serving_natively(_spelling(exporter)) as client:
        reply = await _completed(client, body, header)
    assert reply.status_code == 200 and reply.text.endswith("data: [DONE]\n\n")
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/completions"]
    assert span.context.trace_id == trace_id
    assert span.parent is not None and span.parent.span_id == parent_id
    assert dict(span.attributes or {})["microbatch.stream.chunks"] == 4
