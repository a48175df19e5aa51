"""Issue 19, traces across processes: ``microbatch serve --workers 2 --otel`` carries
the caller's ``traceparent`` from the HTTP process to the hub, whose batches (run in
a model worker process) are linked to the hub's span of the request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import httpx

from tests.serve.test_server import HANG_GUARD_S, ROOT, Server

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7


def console_spans(text: str) -> list[dict[str, Any]]:
    """The spans the SDK's console exporter wrote (JSON objects one after another)."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (start := text.find('{\n    "name"', at)) >= 0:
        span, at = decoder.raw_decode(text, start)
        spans.append(span)
    return spans


def test_traceparent_is_carried_through_the_hub_to_the_batch() -> None:
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "10"}
    command = [sys.executable, "-m", "microbatch", "serve", "tests.http.models:service"]
    process = subprocess.Popen(
        [*command, "--port", "0", "--workers", "2", "--otel"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        server = Server(process, process.stdout.readline().split()[-1])
        server.wait_ready()
        traceparent = f"00-{TRACE_ID:032x}-{CALLER_SPAN:016x}-01"
        reply = httpx.post(
            f"{server.url}/predict",
            json={"x": 2.0},
            headers={"traceparent": traceparent},
            timeout=HANG_GUARD_S,
        )
        assert reply.status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=HANG_GUARD_S)
    spans = console_spans(errors)
    mine = [s for s in spans if int(s["context"]["trace_id"], 16) == TRACE_ID]
    by_name = {s["name"]: s for s in mine}
    request, hub, stage = by_name["POST /predict"], by_name["microbatch hub"], by_name["Double"]
    assert int(request["parent_id"], 16) == CALLER_SPAN
    assert hub["parent_id"] == request["context"]["span_id"]
    assert stage["parent_id"] == hub["context"]["span_id"]
    (link,) = stage["links"]
    (batch,) = [s for s in spans if s["context"]["span_id"] == link["context"]["span_id"]]
    assert batch["name"] == "batch Double" and batch["parent_id"] is None
    assert hub["context"]["span_id"] in {lk["context"]["span_id"] for lk in batch["links"]}
