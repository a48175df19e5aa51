"""ModelStreamInfer, the v2 protocol's streaming extension (Triton's), spoken by the
real ``tritonclient.grpc`` (``start_stream``, ``async_stream_infer``) against a real
``microbatch serve --grpc-port`` with a step model and a one-shot model."""

from __future__ import annotations

import contextlib
import queue
import signal
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.serve.test_server import HANG_GUARD_S

from .conftest import Running, serving

QUIET = ("--log-level", "error")


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    targets = ("tests.protocols.models:double", "tests.streams.served:service")
    with serving(*targets, grpc=True, options=QUIET) as running:
        yield running


class Stream:
    """One ModelStreamInfer call of a tritonclient, its responses collected."""

    def __init__(self, address: str, headers: dict[str, str] | None = None) -> None:
        self.client = grpcclient.InferenceServerClient(address)
        self.responses: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
        self.client.start_stream(
            lambda result, error: self.responses.put((result, error)), headers=headers
        )

    def send(
        self, model: str, inputs: list[grpcclient.InferInput], request_id: str, **kw: Any
    ) -> None:
        self.client.async_stream_infer(model, inputs, request_id=request_id, **kw)

    def take(self, count: int) -> list[tuple[Any, InferenceServerException | None]]:
        return [self.responses.get(timeout=HANG_GUARD_S) for _ in range(count)]

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def _word(text: str, rows: int = 1) -> grpcclient.InferInput:
    given = grpcclient.InferInput("input", [rows, 1], "BYTES")
    given.set_data_from_numpy(np.array([[text.encode()]] * rows, dtype=object))
    return given


def _x(value: float) -> grpcclient.InferInput:
    given = grpcclient.InferInput("x", [1, 1], "FP32")
    given.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return given


def _final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def _chunks(result: Any) -> list[str]:
    output = result.as_numpy("output")
    return [] if output is None else [value.decode() for value in output.ravel()]


def test_a_step_model_answers_one_response_a_chunk_then_an_empty_last(server: Running) -> None:
    assert server.grpc is not None
    stream = Stream(server.grpc)
    try:
        stream.send("counter", [_word("a:4")], "r1", enable_empty_final_response=True)
        got = stream.take(5)
    finally:
        stream.close()
    assert all(error is None for _, error in got)
    results = [result for result, _ in got]
    assert [result.get_response().id for result in results] == ["r1"] * 5
    assert [_chunks(result) for result in results] == [["a-0"], ["a-1"], ["a-2"], ["a-3"], []]
    assert [_final(result) for result in results] == [False] * 4 + [True]
    assert results[0].get_response().outputs[0].datatype == "BYTES"


def test_requests_on_one_call_are_answered_together_each_with_its_own(server: Running) -> None:
    assert server.grpc is not None
    stream = Stream(server.grpc)
    lengths = {f"s{n}": n for n in (3, 9, 1, 6, 12)}
    try:
        for name, length in lengths.items():
            stream.send(
                "counter", [_word(f"{name}:{length}")], name, enable_empty_final_response=True
            )
            stream.send("double", [_x(float(length))], f"d{length}")
        got = stream.take(sum(length + 1 for length in lengths.values()) + len(lengths))
    finally:
        stream.close()
    by_id: dict[str, list[Any]] = {}
    for result, error in got:
        assert error is None
        by_id.setdefault(result.get_response().id, []).append(result)
    assert set(by_id) == set(lengths) | {f"d{n}" for n in lengths.values()}
    for name, length in lengths.items():
        chunks = [chunk for result in by_id[name] for chunk in _chunks(result)]
        assert chunks == [f"{name}-{i}" for i in range(length)]  # its own, in order
        assert [_final(result) for result in by_id[name]] == [False] * length + [True]
        (doubled,) = by_id[f"d{length}"]
        assert doubled.as_numpy("y").tolist() == [[2.0 * length]] and _final(doubled)


def test_a_failing_request_fails_alone_with_its_reason(server: Running) -> None:
    assert server.grpc is not None
    stream = Stream(server.grpc)
    try:
        stream.send("counter", [_word("bad:5:fail@2")], "fails")
        stream.send("counter", [_word("two rows:2", rows=2)], "rows")
        stream.send("nobody", [_word("x:1")], "unknown")
        stream.send("counter", [_word("seq:1")], "sequence", sequence_id=7)
        stream.send("counter", [_word("good:3")], "good", enable_empty_final_response=True)
        got = stream.take(2 + 1 + 1 + 1 + 4)
    finally:
        stream.close()
    errors = [str(error) for _, error in got if error is not None]
    assert len(errors) == 4
    assert any("bad failed at step 2" in text for text in errors)
    assert any("one row a request, got 2" in text for text in errors)
    assert any("no model 'nobody'" in text for text in errors)
    assert any("sequence_id" in text for text in errors)
    answered = [result for result, error in got if error is None]
    chunks: dict[str, list[str]] = {result.get_response().id: [] for result in answered}
    for result in answered:
        chunks[result.get_response().id] += _chunks(result)
    assert chunks == {"fails": ["bad-0", "bad-1"], "good": ["good-0", "good-1", "good-2"]}


def _metric(server: Running, name: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name}")


def _in_service(server: Running) -> float:
    return _metric(server, 'microbatch_items_in_service{service="counter"}')


LEFT = 'microbatch_streams_total{outcome="left",service="counter",stage="Counter"}'


def test_a_client_that_leaves_withdraws_its_streams(server: Running) -> None:
    assert server.grpc is not None
    left = _metric(server, LEFT)
    stream = Stream(server.grpc)
    stream.send("counter", [_word("pid")], "forever")
    stream.send("counter", [_word("pid")], "forever too")
    stream.take(4)  # both are stepping
    assert _in_service(server) == 2
    stream.close(cancel=True)
    give_up = time.monotonic() + HANG_GUARD_S
    while _in_service(server) != 0:  # withdrawn at their next step
        assert time.monotonic() < give_up, "the streams of a client that left go on"
        time.sleep(0.02)
    assert _metric(server, LEFT) == left + 2


def test_the_token_guards_the_stream_call() -> None:
    options = ("--auth-token", "sesame", *QUIET)
    with serving("tests.streams.served:service", grpc=True, options=options) as running:
        assert running.grpc is not None
        refused = Stream(running.grpc)
        with contextlib.suppress(InferenceServerException):  # the call may be ended already
            refused.send("counter", [_word("a:2")], "r")
        ((result, error),) = refused.take(1)
        refused.close()
        assert result is None and error is not None
        assert "UNAUTHENTICATED" in str(error.status()) or "bearer token" in str(error)
        allowed = Stream(running.grpc, headers={"authorization": "Bearer sesame"})
        allowed.send("counter", [_word("a:2")], "r")
        got = allowed.take(2)
        allowed.close()
    assert [_chunks(result) for result, _ in got] == [["a-0"], ["a-1"]]


def test_a_request_past_its_timeout_fails_alone_and_the_call_goes_on(server: Running) -> None:
    assert server.grpc is not None
    stream = Stream(server.grpc)
    try:
        stream.send("counter", [_word("pid")], "timed", timeout=300_000)  # microseconds
        outcome = stream.take(1)[0]
        while outcome[1] is None:  # chunks, until its timeout ends it
            outcome = stream.take(1)[0]
        assert "did not end before its deadline" in str(outcome[1])
        stream.send("counter", [_word("after:2")], "after")
        got = stream.take(2)
    finally:
        stream.close()
    assert [_chunks(result) for result, _ in got] == [["after-0"], ["after-1"]]


def test_a_call_past_its_deadline_ends_and_frees_its_streams(server: Running) -> None:
    assert server.grpc is not None
    client = grpcclient.InferenceServerClient(server.grpc)
    responses: queue.Queue[Any] = queue.Queue()
    client.start_stream(lambda result, error: responses.put((result, error)), stream_timeout=0.5)
    client.async_stream_infer("counter", [_word("pid")], request_id="long")
    outcome = responses.get(timeout=HANG_GUARD_S)
    while outcome[1] is None:  # chunks, until the call's deadline ends it
        outcome = responses.get(timeout=HANG_GUARD_S)
    client.stop_stream()
    client.close()
    # the item's deadline is the call's: whichever ends it first tells the client
    error = str(outcome[1])
    assert "DEADLINE_EXCEEDED" in str(outcome[1].status()) or "deadline" in error, error
    give_up = time.monotonic() + HANG_GUARD_S
    while _in_service(server) != 0:
        assert time.monotonic() < give_up
        time.sleep(0.02)


def test_the_response_message_is_tritons(server: Running) -> None:
    """The extension's response, decoded with our descriptor and with tritonclient's
    own generated classes: the same fields."""
    from tritonclient.grpc import service_pb2

    from microbatch.grpc.messages import SERVICE, message

    request = message("ModelInferRequest")(model_name="counter", id="raw")
    given = request.inputs.add(name="input", datatype="BYTES", shape=[1, 1])
    given.contents.bytes_contents.append(b"z:2")
    assert server.grpc is not None
    with grpc.insecure_channel(server.grpc) as channel:
        call = channel.stream_stream(
            f"/{SERVICE}/ModelStreamInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda data: data,
        )
        raw = list(call(iter([request]), timeout=HANG_GUARD_S))
    assert len(raw) == 2
    theirs = [service_pb2.ModelStreamInferResponse.FromString(data) for data in raw]
    assert [response.infer_response.id for response in theirs] == ["raw", "raw"]
    assert [response.error_message for response in theirs] == ["", ""]


def test_a_unary_call_to_a_model_that_streams_is_refused_with_the_way_to_stream(
    server: Running,
) -> None:
    body = {"inputs": [{"name": "input", "datatype": "BYTES", "shape": [1, 1], "data": ["a:3"]}]}
    reply = httpx.post(f"{server.url}/v2/models/counter/infer", json=body, timeout=HANG_GUARD_S)
    assert reply.status_code == 400
    assert "streams its results" in reply.json()["error"]
    assert server.grpc is not None
    client = grpcclient.InferenceServerClient(server.grpc)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("counter", [_word("a:3")])
    client.close()
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "ModelStreamInfer" in caught.value.message()


def _ready(address: str) -> bool:
    probe = grpcclient.InferenceServerClient(address)
    try:
        return bool(probe.is_server_ready())
    except InferenceServerException:  # no new call taken: draining
        return False
    finally:
        probe.close()


def test_sigterm_lets_open_streams_finish_and_refuses_new_requests() -> None:
    with serving("tests.streams.served:slow", grpc=True, options=QUIET) as running:
        assert running.grpc is not None
        stream = Stream(running.grpc)
        steps = grpcclient.InferInput("input", [1, 1], "INT64")
        steps.set_data_from_numpy(np.array([[25]], dtype=np.int64))  # 25 steps of 20 ms
        stream.send("slow", [steps], "open", enable_empty_final_response=True)
        first = stream.take(1)
        running.process.send_signal(signal.SIGTERM)
        give_up = time.monotonic() + HANG_GUARD_S
        while _ready(running.grpc):  # until the server drains (it takes no new call then)
            assert time.monotonic() < give_up
            time.sleep(0.01)
        stream.send("slow", [steps], "late")
        rest = stream.take(26)  # 24 chunks, the empty last response, the refusal
        stream.close()
        assert running.process.wait(HANG_GUARD_S) == 0
    got = first + rest
    refused = [str(error) for _, error in got if error is not None]
    assert len(refused) == 1 and "shutting down" in refused[0]
    opened = [result for result, error in got if error is None]
    assert [result.get_response().id for result in opened] == ["open"] * 26
    assert [int(result.as_numpy("output")[0, 0]) for result in opened[:25]] == list(range(25))
    assert _final(opened[-1]) and opened[-1].as_numpy("output") is None
