"""The Open Inference Protocol v2 over REST, spoken by the real ``tritonclient[http]``
against a real ``microbatch serve``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .conftest import Running, serving


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    with serving("tests.protocols.models:double", options=("--log-level", "warning")) as running:
        yield running


@pytest.fixture
def client(server: Running) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http, concurrency=16)
    yield client
    client.close()


def _x(values: list[float], binary: bool = True) -> httpclient.InferInput:
    array = np.asarray(values, dtype=np.float32).reshape(-1, 1)
    given = httpclient.InferInput("x", list(array.shape), "FP32")
    given.set_data_from_numpy(array, binary_data=binary)
    return given


def test_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("double")
    assert not client.is_model_ready("nobody")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    metadata = client.get_model_metadata("double")
    assert metadata["name"] == "double"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}]
    assert metadata["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [-1, 1]},
        {"name": "batch", "datatype": "INT64", "shape": [-1, 1]},
    ]


def test_a_batch_of_rows_in_binary(client: httpclient.InferenceServerClient) -> None:
    xs = [0.5, 1.5, 2.5, 3.5, 4.5]
    result = client.infer("double", [_x(xs)])
    y = result.as_numpy("y")
    assert y.dtype == np.float32
    assert y.shape == (5, 1)
    assert y[:, 0].tolist() == [2 * x for x in xs]
    assert result.get_output("y")["parameters"]["binary_data_size"] == 20


def test_json_tensors_both_ways(client: httpclient.InferenceServerClient) -> None:
    outputs = [httpclient.InferRequestedOutput("y", binary_data=False)]
    result = client.infer("double", [_x([1.0, 2.0], binary=False)], outputs=outputs)
    assert result.get_output("y")["data"] == [2.0, 4.0]
    assert result.as_numpy("y")[:, 0].tolist() == [2.0, 4.0]
    assert result.get_output("batch") is None


def test_a_flat_tensor_of_rows_is_taken_too(client: httpclient.InferenceServerClient) -> None:
    given = httpclient.InferInput("x", [3], "FP32")
    given.set_data_from_numpy(np.asarray([1, 2, 3], dtype=np.float32))
    assert client.infer("double", [given]).as_numpy("y")[:, 0].tolist() == [2, 4, 6]


def _status_and_message(call: object) -> tuple[str | None, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()  # type: ignore[operator]
    return caught.value.status(), caught.value.message()


def test_a_wrong_shape_is_400_with_the_reason(client: httpclient.InferenceServerClient) -> None:
    given = httpclient.InferInput("x", [2, 3], "FP32")
    given.set_data_from_numpy(np.zeros((2, 3), dtype=np.float32))
    status, message = _status_and_message(lambda: client.infer("double", [given]))
    assert status == "400"
    assert "shape [2, 3]" in message


def test_a_wrong_datatype_is_400_with_the_reason(client: httpclient.InferenceServerClient) -> None:
    given = httpclient.InferInput("x", [2, 1], "INT32")
    given.set_data_from_numpy(np.zeros((2, 1), dtype=np.int32))
    status, message = _status_and_message(lambda: client.infer("double", [given]))
    assert status == "400"
    assert "INT32" in message


def test_a_data_size_that_does_not_match_the_shape_is_400(server: Running) -> None:
    body = {"inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32", "data": [1.0, 2.0]}]}
    reply = httpx.post(f"{server.url}/v2/models/double/infer", json=body)
    assert reply.status_code == 400
    assert "needs 3 elements" in reply.json()["error"]
    header = b'{"inputs":[{"name":"x","shape":[2,1],"datatype":"FP32",'
    header += b'"parameters":{"binary_data_size":8}}]}'
    reply = httpx.post(
        f"{server.url}/v2/models/double/infer",
        content=header + b"\0" * 6,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert reply.status_code == 400
    assert "body ends before" in reply.json()["error"]


def test_unknown_inputs_and_models(client: httpclient.InferenceServerClient) -> None:
    given = httpclient.InferInput("z", [1, 1], "FP32")
    given.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    status, message = _status_and_message(lambda: client.infer("double", [given]))
    assert (status, "unknown input 'z'" in message) == ("400", True)
    status, _ = _status_and_message(lambda: client.infer("nobody", [_x([1.0])]))
    assert status == "404"


def test_a_model_error_is_500_without_its_detail(client: httpclient.InferenceServerClient) -> None:
    status, message = _status_and_message(lambda: client.infer("double", [_x([13.0])]))
    assert status == "500"
    assert "ValueError" in message
    assert "secret" not in message


def test_deadlines_from_the_header_and_from_parameters(
    client: httpclient.InferenceServerClient,
) -> None:
    slow_row = [_x([7.0])]
    status, _ = _status_and_message(
        lambda: client.infer("double", slow_row, headers={"X-Request-Timeout-Ms": "100"})
    )
    assert status == "504"
    status, _ = _status_and_message(lambda: client.infer("double", slow_row, timeout=100_000))
    assert status == "504"


def test_concurrent_clients_with_distinct_inputs_each_get_their_own_answer(
    client: httpclient.InferenceServerClient,
) -> None:
    pending = [(x, client.async_infer("double", [_x([x, x + 0.5])])) for x in range(100, 164)]
    answers = [(x, request.get_result()) for x, request in pending]
    for x, result in answers:
        assert result.as_numpy("y")[:, 0].tolist() == [2 * x, 2 * x + 1]
    batch_sizes = [int(result.as_numpy("batch").max()) for _, result in answers]
    assert max(batch_sizes) > 2  # rows of different requests shared a batch


def test_overload_is_503() -> None:
    with serving("tests.protocols.models:slow", options=("--log-level", "error")) as running:
        client = httpclient.InferenceServerClient(running.http, concurrency=6)
        pending = [client.async_infer("slow", [_x([float(x)])]) for x in range(6)]
        statuses = []
        for request in pending:
            try:
                request.get_result()
                statuses.append("200")
            except InferenceServerException as error:
                statuses.append(error.status())
        client.close()
    assert "503" in statuses
    assert "200" in statuses
    assert set(statuses) <= {"200", "503"}


def test_bytes_in_and_out() -> None:
    with serving("tests.protocols.models:shout", options=("--log-level", "warning")) as running:
        client = httpclient.InferenceServerClient(running.http)
        texts = np.asarray([["héllo"], ["world"]], dtype=object)
        given = httpclient.InferInput("input", [2, 1], "BYTES")
        given.set_data_from_numpy(texts)
        shouted = client.infer("shout", [given]).as_numpy("output")
        client.close()
    assert [value.decode() for value in shouted[:, 0]] == ["HÉLLO", "WORLD"]


def test_arrays_of_any_shape() -> None:
    with serving("tests.protocols.models:scale", options=("--log-level", "warning")) as running:
        client = httpclient.InferenceServerClient(running.http)
        rows = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        given = httpclient.InferInput("input", [2, 3, 4], "FP32")
        given.set_data_from_numpy(rows)
        doubled = client.infer("scale", [given]).as_numpy("output")
        client.close()
    assert np.array_equal(doubled, rows * 2)


def test_a_bearer_token_guards_inference_not_health() -> None:
    with serving(
        "tests.protocols.models:double", options=("--auth-token", "sesame", "--log-level", "error")
    ) as running:
        client = httpclient.InferenceServerClient(running.http)
        assert client.is_server_ready()
        status, _ = _status_and_message(lambda: client.infer("double", [_x([1.0])]))
        assert status == "401"
        result = client.infer("double", [_x([1.0])], headers={"Authorization": "Bearer sesame"})
        assert result.as_numpy("y")[0, 0] == 2.0
        client.close()


def test_v2_rest_under_several_http_processes() -> None:
    options = ("--workers", "2", "--log-level", "warning")
    with serving("tests.protocols.models:double", options=options) as running:
        client = httpclient.InferenceServerClient(running.http, concurrency=8)
        pending = [(x, client.async_infer("double", [_x([x])])) for x in range(200, 232)]
        answers = [(x, request.get_result().as_numpy("y")[0, 0]) for x, request in pending]
        client.close()
        generated = httpx.post(f"{running.url}/v2/models/double/generate", json={"x": 4.0})
    assert all(y == 2 * x for x, y in answers)
    assert generated.json()["y"] == 8.0  # Triton's generate extension, under --workers too
