"""What the real Ray tracing test deploys: a service whose replicas, when
``MICROBATCH_TEST_SPANS`` names a file, export their spans there as JSON lines (the
replica's own tracer provider, installed when Ray imports this module in it)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

import msgspec
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from microbatch import Model, Service, Stage

SPANS_FILE = "MICROBATCH_TEST_SPANS"


class Point(msgspec.Struct):
    x: float


class Double(Model):
    def predict(self, batch: list[Point]) -> list[float]:
        return [2 * point.x for point in batch]


service = Service(Stage(Double, max_batch_size=16, max_latency_ms=5))


class FileExporter(SpanExporter):
    """Each finished span as one JSON line: name, ids, parent and links."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            context = span.get_span_context()
            assert context is not None
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "trace_id": context.trace_id,
                        "span_id": context.span_id,
                        "parent": None if span.parent is None else span.parent.span_id,
                        "links": [link.context.span_id for link in span.links],
                    }
                )
            )
        with self.lock, open(self.path, "a") as sink:
            sink.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS


if os.environ.get(SPANS_FILE):
    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ[SPANS_FILE])))
    trace.set_tracer_provider(_provider)
