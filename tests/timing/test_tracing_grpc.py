"""Issue 19, traces over gRPC: each ModelInfer call is a span, a child of the W3C
``traceparent`` in its metadata; each of its rows' stage spans is the call span's
child, linked to its batch, and the batches link back to the call spans, under
concurrency (OpenTelemetry SDK's in-memory exporter)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import grpc
import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from microbatch.grpc.messages import SERVICE, message
from microbatch.grpc.server import GrpcConfig, GrpcServer
from microbatch.inference import InferenceModel
from tests.protocols.models import double
from tests.timing.test_tracing import traceparent, tracer_to

CALLS = 12
ROWS = 2
HANG_GUARD_S = 60.0


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    yield spans
    spans.shutdown()


@contextlib.asynccontextmanager
async def _traced_channel(
    models: dict[str, InferenceModel], exporter: InMemorySpanExporter
) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to a gRPC server of ``models`` that traces to ``exporter``."""
    server = GrpcServer(models, GrpcConfig(port=0), tracer=tracer_to(exporter))
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop()


def _infer(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(
        f"/{SERVICE}/ModelInfer",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=message("ModelInferResponse").FromString,
    )


def _request(index: int) -> object:
    request = message("ModelInferRequest")(model_name="double")
    given = request.inputs.add(name="x", datatype="FP32", shape=[ROWS, 1])
    given.contents.fp32_contents.extend([index + 0.25, index + 0.5])
    return request


async def test_model_infer_calls_are_spans_under_the_callers_traceparent(
    exporter: InMemorySpanExporter,
) -> None:
    sent = [traceparent(index) for index in range(CALLS)]
    async with _traced_channel({"double": InferenceModel(double)}, exporter) as channel:
        infer = _infer(channel)
        replies = await asyncio.wait_for(
            asyncio.gather(
                *(
                    infer(_request(i), metadata=(("traceparent", header),))
                    for i, (header, _, _) in enumerate(sent)
                )
            ),
            HANG_GUARD_S,
        )
        untraced = await asyncio.wait_for(infer(_request(99)), HANG_GUARD_S)
    for index, reply in enumerate(replies):
        values = np.frombuffer(reply.raw_output_contents[0], "<f4").tolist()
        assert values == [2 * (index + 0.25), 2 * (index + 0.5)]
    assert untraced.raw_output_contents
    spans = list(exporter.get_finished_spans())
    calls = [span for span in spans if span.name == "ModelInfer"]
    assert len(calls) == CALLS + 1  # the untraced call is a root span of its own
    by_trace = {span.context.trace_id: span for span in calls}
    for _, trace_id, parent_id in sent:
        call = by_trace[trace_id]
        assert call.parent is not None and call.parent.span_id == parent_id
    call_ids = {span.context.span_id for span in calls}
    stage_spans = [span for span in spans if span.name == "double"]
    assert len(stage_spans) == (CALLS + 1) * ROWS  # one per row
    batches = {span.context.span_id: span for span in spans if span.name == "batch double"}
    for span in stage_spans:
        assert span.parent is not None and span.parent.span_id in call_ids
        (link,) = span.links
        batch = batches[link.context.span_id]
        assert span.parent.span_id in {lk.context.span_id for lk in batch.links}
    linked = [lk.context.span_id for batch in batches.values() for lk in batch.links]
    assert sorted(set(linked)) == sorted(call_ids) and len(linked) == len(stage_spans)
    assert max(len(batch.links) for batch in batches.values()) > 1  # rows shared batches


async def test_a_failed_call_ends_its_span_with_the_error(exporter: InMemorySpanExporter) -> None:
    request = message("ModelInferRequest")(model_name="double")
    given = request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    given.contents.fp32_contents.append(13.0)  # the model raises on 13
    async with _traced_channel({"double": InferenceModel(double)}, exporter) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(
                _infer(channel)(request, metadata=(("traceparent", traceparent(1)[0]),)),
                HANG_GUARD_S,
            )
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    (call,) = [span for span in exporter.get_finished_spans() if span.name == "ModelInfer"]
    assert not call.status.is_ok and call.parent is not None


async def test_each_stream_request_is_a_span_with_its_chunks(
    exporter: InMemorySpanExporter,
) -> None:
    from microbatch import Service, Stage
    from tests.streams.models import Counter

    service = Service(Stage(Counter, mode="thread", max_batch_size=4), name="counter")
    header, trace_id, parent_id = traceparent(7)
    models = {"counter": InferenceModel(service)}
    async with service, _traced_channel(models, exporter) as channel:
        call = channel.stream_stream(
            f"/{SERVICE}/ModelStreamInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=message("ModelStreamInferResponse").FromString,
        )(metadata=(("traceparent", header),))
        for text in ("a:3", "b:2"):
            request = message("ModelInferRequest")(model_name="counter", id=text)
            given = request.inputs.add(name="input", datatype="BYTES", shape=[1, 1])
            given.contents.bytes_contents.append(text.encode())
            await call.write(request)
        await call.done_writing()
        responses = await asyncio.wait_for(_all(call), HANG_GUARD_S)
    assert sorted(r.infer_response.id for r in responses) == ["a:3"] * 3 + ["b:2"] * 2
    streams = [span for span in exporter.get_finished_spans() if span.name == "ModelStreamInfer"]
    assert len(streams) == 2
    for span in streams:
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == parent_id
    chunks = sorted(span.attributes["microbatch.stream.chunks"] for span in streams)  # type: ignore[index]
    assert chunks == [2, 3]


async def _all(call: object) -> list[object]:
    return [response async for response in call]  # type: ignore[attr-defined]
