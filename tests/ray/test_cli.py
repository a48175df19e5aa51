"""``microbatch serve MODULE:ATTR --ray``: a real command, its own local Ray instance.

Every test starts its own process and stops only that process, by its PID; the
command must stop its Ray instance itself. Timeouts here are hang guards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .conftest import free_port
from .processes import descendants, wait_gone

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 90.0


def serve(*options: str, hide_ray: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``microbatch serve`` to completion (for the commands that must fail)."""
    hide = "import sys; sys.modules['ray'] = None; " if hide_ray else ""
    code = f"{hide}from microbatch.cli import main; raise SystemExit(main({list(options)!r}))"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def test_without_ray_installed_the_error_says_how_to_get_it() -> None:
    done = serve("serve", "tests.ray.models:service", "--ray", hide_ray=True)
    assert done.returncode == 2
    assert "pip install 'microbatch[ray]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_cluster_that_cannot_be_reached_is_a_clear_error_at_once() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    done = serve("serve", "tests.ray.models:service", "--ray", "--ray-address", address)
    assert done.returncode == 1
    assert f"cannot reach the Ray cluster at {address}" in done.stderr
    assert "Traceback" not in done.stderr
    malformed = serve("serve", "tests.ray.models:service", "--ray", "--ray-address", "head")
    assert malformed.returncode == 1
    assert "expected a Ray address as HOST:PORT" in malformed.stderr


def test_serve_ray_deploys_two_replicas_serves_and_stops_without_leftovers() -> None:
    command = [
        *(sys.executable, "-m", "microbatch", "serve", "tests.ray.models:service"),
        *("--ray", "--replicas", "2", "--replica-cpus", "0.25"),
        *("--port", "0", "--log-level", "warning"),
    ]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        prefix = "microbatch serving on "
        assert line.startswith(prefix), f"unexpected first line {line!r}"
        url = line.removeprefix(prefix).strip()
        wait_ready(url)
        xs = [i + 0.5 for i in range(64)]
        replies = asyncio.run(post_all(url, xs))
        assert [r.status_code for r in replies] == [200] * len(xs)
        assert [r.json()["y"] for r in replies] == [2 * x for x in xs]
        assert len({r.json()["replica"] for r in replies}) == 2
        started = descendants(process.pid)
        assert started, "the command started no Ray processes"
        process.send_signal(signal.SIGTERM)
        assert process.wait(HANG_GUARD_S) == 0
        left = wait_gone(started, HANG_GUARD_S)
        assert not left, f"Ray processes left behind: {sorted(left)}"
    finally:
        stop_on_failure(process)


def stop_on_failure(process: subprocess.Popen[str]) -> None:
    """After a failed test: stop the command and what it started (its Ray instance)."""
    if process.poll() is None:
        started = descendants(process.pid)
        process.terminate()
        try:
            process.wait(HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for pid in wait_gone(started, 10.0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if process.stdout is not None:
        process.stdout.close()


def wait_ready(url: str) -> None:
    """Until /health/ready answers 200 through Ray's proxy (bounded)."""
    give_up = time.monotonic() + HANG_GUARD_S
    with httpx.Client(base_url=url) as client:
        while True:
            try:
                if client.get("/health/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < give_up, "never became ready"
            time.sleep(0.1)


async def post_all(url: str, xs: list[float]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD_S) as client:
        return await asyncio.gather(*(client.post("/predict", json={"x": x}) for x in xs))
