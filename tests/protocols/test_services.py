"""Several services in one server: ``microbatch serve a:x b:y`` (and gRPC beside it)."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from .conftest import serving
from .models import expected_vector

TARGETS = (
    "tests.protocols.models:double",
    "tests.protocols.models:embed",
    "tests.protocols.models:shout",
)


def test_each_service_under_its_name_with_every_protocol() -> None:
    with serving(*TARGETS, grpc=True, options=("--log-level", "warning")) as running:
        url = running.url
        assert httpx.get(f"{url}/health/ready").status_code == 200
        assert httpx.post(f"{url}/double/predict", json={"x": 2}).json() == {"y": 4.0, "batch": 1}
        assert httpx.post(f"{url}/shout/predict", json="hi").json() == "HI"
        assert httpx.get(f"{url}/double/health/ready").status_code == 200
        assert "/predict" in httpx.get(f"{url}/embed/openapi.json").json()["paths"]
        assert httpx.post(f"{url}/predict", json={"x": 2}).status_code == 404
        assert httpx.post(f"{url}/nobody/predict", json={"x": 2}).status_code == 404

        rest = httpclient.InferenceServerClient(running.http)
        assert rest.is_server_ready()
        assert all(rest.is_model_ready(name) for name in ("double", "embed", "shout"))
        given = httpclient.InferInput("x", [1, 1], "FP32")
        given.set_data_from_numpy(np.asarray([[3.0]], dtype=np.float32))
        assert rest.infer("double", [given]).as_numpy("y")[0, 0] == 6.0
        rest.close()

        assert running.grpc is not None
        remote = grpcclient.InferenceServerClient(running.grpc)
        given = grpcclient.InferInput("input", [1, 1], "BYTES")
        given.set_data_from_numpy(np.asarray([[b"abc"]], dtype=object))
        assert remote.infer("shout", [given]).as_numpy("output")[0, 0] == b"ABC"
        remote.close()

        with openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0) as client:
            assert [model.id for model in client.models.list()] == ["embed"]
            reply = client.embeddings.create(model="embed", input="abc", encoding_format="float")
            assert reply.data[0].embedding == expected_vector("abc")
            try:
                client.embeddings.create(model="double", input="abc")
            except openai.NotFoundError as error:
                assert isinstance(error.body, dict)
                assert error.body["code"] == "model_not_found"
            else:
                raise AssertionError("double is no embedding model")


def test_two_services_with_one_name_are_refused() -> None:
    import subprocess
    import sys

    from .conftest import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "microbatch", "serve", TARGETS[0], TARGETS[0], "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "two services are named 'double'" in done.stderr


def test_more_targets_and_grpc_are_refused_with_workers_and_ray(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from microbatch.cli._options import parse

    parsed = parse(["serve", TARGETS[0], TARGETS[1], "--grpc-port", "0"])
    assert parsed.values["more_targets"] == [TARGETS[1]]
    assert parsed.values["grpc_port"] == 0
    assert parse(["serve", TARGETS[0]]).values["more_targets"] == ()
    for argv in (
        ["serve", TARGETS[0], TARGETS[1], "--workers", "2"],
        ["serve", TARGETS[0], "--grpc-port", "0", "--ray"],
    ):
        with pytest.raises(SystemExit):
            parse(argv)
        assert "does not work with" in capsys.readouterr().err
