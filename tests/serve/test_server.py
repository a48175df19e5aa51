"""``microbatch serve`` end to end: a real server on a free port of 127.0.0.1.

Every test starts its own server process and stops only that process, by its PID.
Timeouts here are hang guards, never pass criteria.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.server_process import ROOT, Server, serve_command, stop, url_from_first_line

HANG_GUARD_S = 30.0


@contextmanager
def running(target: str, *options: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    """Start ``microbatch serve TARGET --port 0``; yield once it printed its URL."""
    process = subprocess.Popen(
        serve_command(target, "--port", "0", *options),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        server = Server(process, url_from_first_line(process), HANG_GUARD_S)
        server.wait_ready()
        yield server
    finally:
        stop(process, HANG_GUARD_S)


async def _post_all(url: str, xs: list[float]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=HANG_GUARD_S) as client:
        return await asyncio.gather(*(client.post("/predict", json={"x": x}) for x in xs))


WORKERS = pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "two-http-processes"])
"""The tests marked so run against ``--workers 1`` (HTTP in the serving process) and
``--workers 2`` (two HTTP processes relaying to the one Service)."""


@WORKERS
def test_concurrent_clients_get_their_own_answers_from_a_service(workers: str) -> None:
    xs = [x + 0.25 for x in range(200)]
    with running(
        "tests.http.models:service", "--log-level", "warning", "--workers", workers
    ) as server:
        replies = asyncio.run(_post_all(server.url, xs))
    assert [r.status_code for r in replies] == [200] * len(xs)
    assert [r.json()["y"] for r in replies] == [2 * x for x in xs]


def test_requests_leave_no_reference_cycles_for_the_collector() -> None:
    """A request's objects are freed by reference counting. A reference cycle per
    request (there was one, between uvicorn's request cycle and our response writer)
    left about ten objects each for the garbage collector: 10,000 here, twenty times
    the bound."""
    with running("tests.http.models:service", "--log-level", "warning") as server:
        before = _objects_collected(server.url)
        replies = [
            reply
            for start in range(0, 1000, 200)
            for reply in asyncio.run(_post_all(server.url, [start + x + 0.25 for x in range(200)]))
        ]
        after = _objects_collected(server.url)
    assert [r.status_code for r in replies] == [200] * 1000
    assert after - before < 500


def _objects_collected(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=HANG_GUARD_S).text
    samples = re.findall(r"^python_gc_objects_collected_total\{[^}]*\} (\S+)$", text, re.M)
    assert len(samples) == 3  # one per generation
    return sum(float(sample) for sample in samples)


@WORKERS
def test_a_batched_function_behind_a_bearer_token_from_the_environment(workers: str) -> None:
    env = {"MICROBATCH_AUTH_TOKEN": "from-env"}
    with (
        running("tests.http.models:double", "--workers", workers, env=env) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        refused = client.post("/predict", json={"x": 1})
        allowed = client.post(
            "/predict", json={"x": 1}, headers={"authorization": "Bearer from-env"}
        )
    assert refused.status_code == 401
    assert allowed.json() == {"y": 2.0}


@WORKERS
def test_a_20_mib_body_gets_413_without_being_sent(workers: str) -> None:
    with (
        running("tests.http.models:double", "--workers", workers) as server,
        socket.create_connection(server.address, timeout=HANG_GUARD_S) as conn,
    ):
        conn.sendall(
            b"POST /predict HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
            b"content-length: 20971520\r\n\r\n" + b" " * 65536
        )
        reply = conn.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413 ")


@WORKERS
def test_a_slow_header_client_does_not_stall_others_and_is_cut_off(workers: str) -> None:
    xs = [x + 0.5 for x in range(20)]
    with (
        running(
            "tests.http.models:double", "--header-timeout-s", "1", "--workers", workers
        ) as server,
        socket.create_connection(server.address, timeout=HANG_GUARD_S) as slow,
    ):
        slow.sendall(b"POST /predict HTTP/1.1\r\nhost: test\r\n")  # and no more
        replies = asyncio.run(_post_all(server.url, xs))
        assert [r.json()["y"] for r in replies] == [2 * x for x in xs]
        cut_off = slow.recv(65536)
        closed = slow.recv(65536)
    assert cut_off.startswith(b"HTTP/1.1 408 ")
    assert closed == b""


def test_a_kept_alive_connection_gets_a_fresh_header_deadline_per_request() -> None:
    """Requests 0.6 s apart on one connection, with a 1 s header deadline: each one's
    headers are on time, so none is cut off although the connection lives past 1 s;
    then, idle, it is cut off one deadline after its last response."""
    request = (
        b"POST /predict HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
        b'content-length: 8\r\n\r\n{"x": 2}'
    )
    with (
        running("tests.http.models:double", "--header-timeout-s", "1") as server,
        socket.create_connection(server.address, timeout=HANG_GUARD_S) as conn,
    ):
        replies = []
        for _ in range(4):
            conn.sendall(request)
            replies.append(conn.recv(65536))
            time.sleep(0.6)
        cut_off = conn.recv(65536)
    assert all(reply.startswith(b"HTTP/1.1 200 ") for reply in replies)
    assert cut_off.startswith(b"HTTP/1.1 408 ")


def test_a_slow_body_gets_408_and_others_are_served() -> None:
    with (
        running("tests.http.models:double", "--body-timeout-s", "0.5") as server,
        socket.create_connection(server.address, timeout=HANG_GUARD_S) as slow,
    ):
        slow.sendall(
            b"POST /predict HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n" + b'{"x": '  # and no more
        )
        replies = asyncio.run(_post_all(server.url, [1.5, 2.5]))
        cut_off = slow.recv(65536)
    assert [r.json()["y"] for r in replies] == [3.0, 5.0]
    assert cut_off.startswith(b"HTTP/1.1 408 ")


@WORKERS
def test_a_client_that_disconnects_while_queued_is_never_computed(workers: str) -> None:
    with running("tests.http.models:double", "--workers", workers) as server:

        async def hold_the_slot_then_leave() -> httpx.Response:
            async with httpx.AsyncClient(base_url=server.url, timeout=HANG_GUARD_S) as client:
                busy = asyncio.ensure_future(client.post("/predict", json={"x": 7}))  # 0.5 s
                await asyncio.sleep(0.1)
                _, writer = await asyncio.open_connection(*server.address)
                body = b'{"x": 4}'
                writer.write(
                    b"POST /predict HTTP/1.1\r\nhost: test\r\ncontent-type: application/json"
                    b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
                await asyncio.sleep(0.1)
                writer.close()  # gone while its item waits behind the busy batch
                return await busy

        held = asyncio.run(hold_the_slot_then_leave())
        assert held.json() == {"y": 14.0}
        # With several HTTP processes, each scrape may see the others' counts up to
        # half a second late: wait for them (bounded).
        _until_metrics(
            server.url,
            'microbatch_items_dropped_total{reason="cancelled",stage="double"} 1.0',
            'microbatch_http_requests_total{route="/predict",status="499"} 1.0',
        )


def _until_metrics(url: str, *lines: str) -> str:
    """Scrape /metrics until it has every line (bounded by the hang guard)."""
    give_up = time.monotonic() + HANG_GUARD_S
    while True:
        text = httpx.get(url + "/metrics", timeout=HANG_GUARD_S).text
        missing = [line for line in lines if line not in text]
        if not missing:
            return text
        assert time.monotonic() < give_up, f"never scraped {missing}"
        time.sleep(0.05)


@WORKERS
def test_sigterm_under_load_answers_every_accepted_request_and_exits_0(workers: str) -> None:
    xs = [float(x) for x in range(40)]
    with running(
        "tests.http.models:slow_service", "--log-level", "warning", "--workers", workers
    ) as server:

        async def load_then_terminate() -> tuple[list[httpx.Response], int | None]:
            async with httpx.AsyncClient(base_url=server.url, timeout=HANG_GUARD_S) as client:
                requests = [
                    asyncio.ensure_future(client.post("/predict", json={"x": x})) for x in xs
                ]
                await _until_in_service(client, len(xs))
                server.process.send_signal(signal.SIGTERM)
                probe = await _ready_status_on_a_new_connection(server.url)
                return list(await asyncio.gather(*requests)), probe

        replies, probe = asyncio.run(load_then_terminate())
        exit_code = server.process.wait(HANG_GUARD_S)
    assert [r.status_code for r in replies] == [200] * len(xs)
    assert [r.json()["y"] for r in replies] == [2 * x for x in xs]
    assert probe in (None, 503)  # refused, or not ready: never 200 once draining
    assert exit_code == 0


async def _until_in_service(client: httpx.AsyncClient, count: int) -> None:
    """Scrape /metrics until ``count`` items have reached the service: queued, or
    released in batches (bounded). With several HTTP processes a scrape may be half a
    second old, long enough for some to be answered already: they count too."""
    give_up = time.monotonic() + HANG_GUARD_S
    while _reached((await client.get("/metrics")).text) < count:
        assert time.monotonic() < give_up, "the requests never reached the service"
        await asyncio.sleep(0.02)


def _reached(metrics: str) -> float:
    pattern = r"^microbatch_(?:queue_depth|batch_size_sum)\{[^}]*\} (\S+)$"
    return sum(float(value) for value in re.findall(pattern, metrics, re.M))


async def _ready_status_on_a_new_connection(url: str) -> int | None:
    try:
        async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD_S) as probe:
            return (await probe.get("/health/ready")).status_code
    except httpx.TransportError:
        return None


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m microbatch ARGS`` to its end (bounded), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "microbatch", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def test_a_bad_target_exits_2_with_a_message() -> None:
    done = run_cli("serve", "tests.http.models:nothing_here")
    assert done.returncode == 2
    assert "nothing_here" in done.stderr


def test_a_service_that_cannot_start_exits_non_zero_without_serving() -> None:
    done = run_cli("serve", "tests.http.models:broken_service")
    assert done.returncode != 0
    assert "microbatch serving on" not in done.stdout
    assert "no weights at /nowhere" in done.stderr


@pytest.mark.parametrize("target", ["in_a_worker", "in_the_server"])
def test_served_math_libraries_get_a_share_of_the_cores_unless_told(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from microbatch.pipeline.worker_env import THREAD_VARIABLES, usable_cores

    for name in THREAD_VARIABLES:  # the server inherits this environment
        monkeypatch.delenv(name, raising=False)
    expected = max(1, usable_cores() - 1)  # one worker's share; the event loop's core left
    served = f"tests.serve.threads_served:{target}"
    with running(served) as server:
        reply = httpx.post(f"{server.url}/predict", json=1.0, timeout=HANG_GUARD_S)
    assert reply.status_code == 200, reply.text
    assert reply.json()["blas"] == expected
    if target == "in_a_worker":
        assert reply.json()["omp"] == str(expected)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")  # told: both leave every pool alone
    with running(served) as server:
        reply = httpx.post(f"{server.url}/predict", json=1.0, timeout=HANG_GUARD_S)
    assert reply.json()["omp"] is None
    assert reply.json()["blas"] == min(2, usable_cores())  # OpenBLAS: at most one per core
