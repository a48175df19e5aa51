"""The Open Inference Protocol v2 over gRPC, spoken by the real ``tritonclient[grpc]``
against a real ``microbatch serve --grpc-port``."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.serve.test_server import HANG_GUARD_S

from .conftest import Running, serving

QUIET = ("--log-level", "warning")


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    with serving("tests.protocols.models:double", grpc=True, options=QUIET) as running:
        yield running


@pytest.fixture
def client(server: Running) -> Iterator[grpcclient.InferenceServerClient]:
    assert server.grpc is not None
    client = grpcclient.InferenceServerClient(server.grpc)
    yield client
    client.close()


def _x(values: list[float]) -> grpcclient.InferInput:
    array = np.asarray(values, dtype=np.float32).reshape(-1, 1)
    given = grpcclient.InferInput("x", list(array.shape), "FP32")
    given.set_data_from_numpy(array)
    return given


def _status(call: Callable[[], object]) -> tuple[str | None, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.status(), caught.value.message()


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("double")
    assert not client.is_model_ready("nobody")
    assert "binary_tensor_data" in client.get_server_metadata().extensions
    metadata = client.get_model_metadata("double", as_json=True)
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "1"]}]
    assert [output["name"] for output in metadata["outputs"]] == ["y", "batch"]


def test_a_batch_of_rows(client: grpcclient.InferenceServerClient) -> None:
    xs = [0.5, 1.5, 2.5]
    result = client.infer("double", [_x(xs)])
    assert result.as_numpy("y")[:, 0].tolist() == [2 * x for x in xs]
    only_y = client.infer("double", [_x(xs)], outputs=[grpcclient.InferRequestedOutput("y")])
    assert only_y.as_numpy("batch") is None


def test_a_wrong_shape_and_datatype_are_invalid_argument(
    client: grpcclient.InferenceServerClient,
) -> None:
    given = grpcclient.InferInput("x", [2, 3], "FP32")
    given.set_data_from_numpy(np.zeros((2, 3), dtype=np.float32))
    status, message = _status(lambda: client.infer("double", [given]))
    assert status == "StatusCode.INVALID_ARGUMENT"
    assert "shape [2, 3]" in message
    given = grpcclient.InferInput("x", [1, 1], "FP64")
    given.set_data_from_numpy(np.zeros((1, 1), dtype=np.float64))
    assert client.infer("double", [given]).as_numpy("y")[0, 0] == 0.0  # FP64 is taken too
    given = grpcclient.InferInput("x", [1, 1], "BYTES")
    given.set_data_from_numpy(np.asarray([[b"1"]], dtype=object))
    status, message = _status(lambda: client.infer("double", [given]))
    assert status == "StatusCode.INVALID_ARGUMENT"
    assert "BYTES" in message


def test_an_unknown_model_is_not_found(client: grpcclient.InferenceServerClient) -> None:
    status, _ = _status(lambda: client.infer("nobody", [_x([1.0])]))
    assert status == "StatusCode.NOT_FOUND"


def test_a_model_error_is_internal_with_a_short_message(
    client: grpcclient.InferenceServerClient,
) -> None:
    status, message = _status(lambda: client.infer("double", [_x([13.0])]))
    assert status == "StatusCode.INTERNAL"
    assert "secret" not in message


def test_the_grpc_deadline_is_the_items_deadline(client: grpcclient.InferenceServerClient) -> None:
    status, _ = _status(lambda: client.infer("double", [_x([7.0])], client_timeout=0.1))
    assert status == "StatusCode.DEADLINE_EXCEEDED"


def test_concurrent_clients_with_distinct_inputs_each_get_their_own_answer(
    client: grpcclient.InferenceServerClient,
) -> None:
    import queue

    answers: queue.Queue[tuple[float, object]] = queue.Queue()
    xs = [float(x) for x in range(100, 164)]
    for x in xs:
        client.async_infer(
            "double", [_x([x, x + 0.5])], lambda result, error, x=x: answers.put((x, result, error))
        )
    got = [answers.get(timeout=HANG_GUARD_S) for _ in xs]
    batch_sizes = []
    for x, result, error in got:  # type: ignore[misc]
        assert error is None
        assert result.as_numpy("y")[:, 0].tolist() == [2 * x, 2 * x + 1]
        batch_sizes.append(int(result.as_numpy("batch").max()))
    assert max(batch_sizes) > 2  # rows of different calls shared a batch


def test_overload_is_resource_exhausted() -> None:
    with serving("tests.protocols.models:slow", grpc=True, options=("--log-level", "error")) as run:
        assert run.grpc is not None
        client = grpcclient.InferenceServerClient(run.grpc)
        import queue

        outcomes: queue.Queue[str] = queue.Queue()
        for x in range(6):
            client.async_infer(
                "slow",
                [_x([float(x)])],
                lambda result, error: outcomes.put("OK" if error is None else error.status()),
            )
        statuses = [outcomes.get(timeout=HANG_GUARD_S) for _ in range(6)]
        client.close()
    assert "StatusCode.RESOURCE_EXHAUSTED" in statuses
    assert "OK" in statuses


def test_the_token_is_metadata_and_health_needs_none() -> None:
    options = ("--auth-token", "sesame", "--log-level", "error")
    with serving("tests.protocols.models:double", grpc=True, options=options) as running:
        assert running.grpc is not None
        client = grpcclient.InferenceServerClient(running.grpc)
        assert client.is_server_ready()
        status, _ = _status(lambda: client.infer("double", [_x([1.0])]))
        assert status == "StatusCode.UNAUTHENTICATED"
        headers = {"authorization": "Bearer sesame"}
        assert client.infer("double", [_x([1.0])], headers=headers).as_numpy("y")[0, 0] == 2.0
        client.close()


def test_a_message_over_the_size_limit_is_refused() -> None:
    options = ("--max-body-bytes", "1000", "--log-level", "error")
    with serving("tests.protocols.models:scale", grpc=True, options=options) as running:
        assert running.grpc is not None
        client = grpcclient.InferenceServerClient(running.grpc)
        given = grpcclient.InferInput("input", [1, 1000], "FP32")
        given.set_data_from_numpy(np.zeros((1, 1000), dtype=np.float32))
        status, _ = _status(lambda: client.infer("scale", [given]))
        client.close()
    assert status == "StatusCode.RESOURCE_EXHAUSTED"


def test_sigterm_drains_grpc_calls_in_flight() -> None:
    with serving("tests.protocols.models:double", grpc=True, options=QUIET) as running:
        assert running.grpc is not None
        channel = grpc.insecure_channel(running.grpc)
        client = grpcclient.InferenceServerClient(running.grpc)
        import queue

        outcomes: queue.Queue[object] = queue.Queue()
        client.async_infer("double", [_x([7.0])], lambda result, error: outcomes.put(error))
        _wait_in_flight(running)
        running.process.send_signal(signal.SIGTERM)
        assert outcomes.get(timeout=HANG_GUARD_S) is None  # the 0.5 s call finished
        assert running.process.wait(HANG_GUARD_S) == 0
        client.close()
        channel.close()


def _wait_in_flight(running: Running) -> None:
    """Until the server's metrics show one item inside the service."""
    import time

    import httpx

    give_up = time.monotonic() + HANG_GUARD_S
    while "microbatch_items_in_service 1.0" not in httpx.get(f"{running.url}/metrics").text:
        assert time.monotonic() < give_up
        time.sleep(0.01)


def test_the_vendored_descriptors_are_the_compiled_protos(tmp_path: Path) -> None:
    import grpc_tools  # noqa: F401  (in the test extra: the descriptors are compiled with it)

    from microbatch.grpc import messages

    for descriptor in messages.DESCRIPTOR_SETS:
        proto = descriptor.with_suffix(".proto")
        out = tmp_path / descriptor.name
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{proto.parent}",
                f"--descriptor_set_out={out}",
                proto.name,
            ],
            check=True,
        )
        assert out.read_bytes() == descriptor.read_bytes(), proto.name


def test_typed_contents_instead_of_raw_bytes(server: Running) -> None:
    from microbatch.grpc.messages import SERVICE, message

    request = message("ModelInferRequest")(model_name="double")
    given = request.inputs.add(name="x", datatype="FP32", shape=[2, 1])
    given.contents.fp32_contents.extend([1.5, 2.5])
    assert server.grpc is not None
    with grpc.insecure_channel(server.grpc) as channel:
        infer = channel.unary_unary(
            f"/{SERVICE}/ModelInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=message("ModelInferResponse").FromString,
        )
        reply = infer(request, timeout=HANG_GUARD_S)
        assert [output.name for output in reply.outputs] == ["y", "batch"]
        assert np.frombuffer(reply.raw_output_contents[0], "<f4").tolist() == [3.0, 5.0]
        short = message("ModelInferRequest")(model_name="double")
        bad = short.inputs.add(name="x", datatype="FP32", shape=[3, 1])
        bad.contents.fp32_contents.extend([1.0])
        with pytest.raises(grpc.RpcError) as caught:
            infer(short, timeout=HANG_GUARD_S)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "needs 3 elements" in caught.value.details()
