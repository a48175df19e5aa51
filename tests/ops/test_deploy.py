"""Issue 19, deployment: the Dockerfile's install and start steps (scripts it runs,
run here for real), the image build where a container runtime is available, and the
Kubernetes manifests validated against the Kubernetes schemas and against the
server's own settings."""

from __future__ import annotations

import os
import shlex
import signal
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from microbatch.cli._config import apply_stage_settings
from microbatch.cli._options import parse
from microbatch.loading import load_target
from tests.server_process import stop, url_from_first_line

from .server import HANG_GUARD_S, ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSION = "1.30.0"  # the oldest supported release we validate against too


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            instructions.append((word.upper(), " ".join(rest.split())))
    return instructions


def test_the_dockerfile_installs_and_starts_with_the_scripts_tested_here() -> None:
    steps = dockerfile_instructions()
    runs = [args for kind, args in steps if kind == "RUN"]
    assert any("sh deploy/install.sh ." in run for run in runs), runs
    copies = [args for kind, args in steps if kind == "COPY"]
    assert "deploy/install.sh deploy/docker-entrypoint.sh ./deploy/" in copies
    assert "src ./src" in copies and "pyproject.toml README.md hatch_build.py ./" in copies
    (entrypoint,) = [args for kind, args in steps if kind == "ENTRYPOINT"]
    assert entrypoint == '["/srv/microbatch/deploy/docker-entrypoint.sh"]'
    (workdir,) = [args for kind, args in steps if kind == "WORKDIR"]
    assert workdir == "/srv/microbatch"
    env = " ".join(args for kind, args in steps if kind == "ENV")
    assert "MICROBATCH_HOST=0.0.0.0" in env and "MICROBATCH_LOG_FORMAT=json" in env
    assert ("USER", "10001") in steps  # not root


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with microbatch installed by deploy/install.sh
    (offline: the dependencies come from the test run's environment)."""
    venv = tmp_path_factory.mktemp("image") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=HANG_GUARD_S)
    # The packages of the test run's environment come after the new one's own.
    (site_packages,) = venv.glob("lib/python*/site-packages")
    (site_packages / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {
        **os.environ,
        "PYTHON": str(venv / "bin" / "python"),
        "PIP_INSTALL_OPTIONS": "--no-index --no-deps --no-build-isolation --quiet",
        # install.sh's steps, not the compilation (.ci/run tests the compiled wheel)
        "MICROBATCH_PURE": "1",
    }
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        ["sh", str(DEPLOY / "install.sh"), str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("microbatch ")  # the script's own check
    return venv


def test_the_installed_package_is_the_one_in_the_new_environment(installed: Path) -> None:
    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import microbatch; print(microbatch.__file__)"],
        capture_output=True,
        text=True,
        cwd="/",
        env={"PATH": os.environ["PATH"]},
        timeout=HANG_GUARD_S,
        check=True,
    ).stdout
    assert where.startswith(str(installed)), where
    assert (installed / "bin" / "microbatch").exists()


def test_the_entrypoint_serves_with_a_token_and_drains_on_sigterm(installed: Path) -> None:
    env = {
        "PATH": f"{installed / 'bin'}:{os.environ['PATH']}",
        "MICROBATCH_TARGET": "tests.http.models:double",
        "MICROBATCH_HOST": "127.0.0.1",  # the image says 0.0.0.0; the test stays on loopback
        "MICROBATCH_PORT": "0",
        "MICROBATCH_LOG_FORMAT": "json",
        "MICROBATCH_AUTH_TOKEN": "from-a-secret",
    }
    process = subprocess.Popen(
        [str(DEPLOY / "docker-entrypoint.sh"), "--drain-delay-s", "0"],
        cwd=ROOT,  # the image's WORKDIR holds the served code; here, the tests
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = url_from_first_line(process)
        token = {"authorization": "Bearer from-a-secret"}
        with httpx.Client(base_url=url, timeout=HANG_GUARD_S) as client:
            assert client.get("/health/live").status_code == 200
            assert client.post("/predict", json={"x": 1}).status_code == 401
            assert client.post("/predict", json={"x": 1}, headers=token).json() == {"y": 2.0}
        process.send_signal(signal.SIGTERM)  # exec: the server itself gets it
        assert process.wait(HANG_GUARD_S) == 0
    finally:
        stop(process, HANG_GUARD_S)


def test_the_entrypoint_says_what_is_missing() -> None:
    done = subprocess.run(
        [str(DEPLOY / "docker-entrypoint.sh")],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 2 and "MICROBATCH_TARGET" in done.stderr


# -- Kubernetes ---------------------------------------------------------------------------


def documents() -> list[dict[str, Any]]:
    return [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("version", [KUBERNETES_VERSION, kubernetes_validate.latest_version()])
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_each_manifest_is_valid_against_the_kubernetes_schemas(path: Path, version: str) -> None:
    for document in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(document, version, strict=True)


def by_kind(kind: str) -> dict[str, Any]:
    (document,) = [doc for doc in documents() if doc["kind"] == kind]
    return document


def test_an_invalid_manifest_is_caught() -> None:
    broken = by_kind("Deployment")
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_deployment_probes_shm_token_and_drain_fit_the_server() -> None:
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory" and shm["sizeLimit"]
    env = {item["name"]: item for item in container["env"]}
    secret = env["MICROBATCH_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert secret["name"] == by_kind("Secret")["metadata"]["name"]
    # The container's arguments are a real command line of `microbatch serve`.
    target = env["MICROBATCH_TARGET"]["value"]
    args = [arg for arg in container["args"] if not arg.startswith("/etc/microbatch")]
    args = [arg for arg in args if arg != "--config"]
    parsed = parse(["serve", target, *args])
    assert parsed.host == "0.0.0.0"
    assert pod["terminationGracePeriodSeconds"] > parsed.drain_delay_s + parsed.graceful_timeout_s
    ready = container["readinessProbe"]
    assert ready["periodSeconds"] * ready["failureThreshold"] < parsed.drain_delay_s
    port = container["ports"][0]
    assert port["containerPort"] == parsed.port
    assert by_kind("Service")["spec"]["ports"][0]["targetPort"] == port["name"]
    assert shlex.join(container["args"]).count("--config /etc/microbatch/microbatch.toml") == 1


def test_the_config_map_is_a_settings_file_the_served_target_accepts(tmp_path: Path) -> None:
    text = by_kind("ConfigMap")["data"]["microbatch.toml"]
    tomllib.loads(text)
    config = tmp_path / "microbatch.toml"
    config.write_text(text)
    container = by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]
    target = next(e["value"] for e in container["env"] if e["name"] == "MICROBATCH_TARGET")
    parsed = parse(["serve", target, "--config", str(config)])
    served = apply_stage_settings(load_target(target), parsed.stage)
    (stage,) = served.stages  # type: ignore[attr-defined]
    assert stage.config.max_batch_size == 128
