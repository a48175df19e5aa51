"""Issue 6, item 11: secure defaults. The server listens on 127.0.0.1 only unless
told; with --auth-token every route but the probes answers 401 without the token;
no error body carries a traceback, a path or the model's own message."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter
from pathlib import Path

import msgspec

from .harness import (
    Connection,
    Reply,
    children,
    eventually,
    listening_tcp,
    metric,
    report,
    run,
    serving,
)
from .models import MARKER_ENV, Job

TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
PROTECTED = [("POST", "/predict"), ("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/docs")]
PROBES = [("GET", "/health/live"), ("GET", "/health/ready")]
WRONG = [
    {},
    {"authorization": "Bearer wrong"},
    {"authorization": TOKEN},
    {"authorization": f"Basic {TOKEN}"},
    {"authorization": f"Bearer {TOKEN}x"},
    {"authorization": f"Bearer {TOKEN[:-1]}"},
]
LEAKS = re.compile(r'Traceback|File "|\.py\b|line \d+|/srv/|secret|weights', re.IGNORECASE)


def test_the_default_address_is_loopback_only() -> None:
    with serving("echo") as server:
        listening = listening_tcp(server.process.pid)
    report("default bind", listening=listening)
    assert listening == [f"127.0.0.1:{server.address[1]}"]


def test_without_the_token_every_route_but_the_probes_is_refused() -> None:
    with serving("poison", "--auth-token", TOKEN) as server:
        refused, probes, allowed = run(try_routes(server.address))
    report("auth token", refused=Counter(refused), probes=Counter(probes), with_token=allowed)
    assert set(refused) == {401} and len(refused) == len(PROTECTED) * len(WRONG)
    assert set(probes) == {200}
    assert set(allowed) == {200}


async def try_routes(address: tuple[str, int]) -> tuple[list[int], list[int], list[int]]:
    connection = await Connection.open(address)
    refused, probes, allowed = [], [], []
    for method, path in PROTECTED:
        body = msgspec.json.encode(Job(1)) if method == "POST" else b""
        for headers in WRONG:
            reply = await connection.request(method, path, body, headers)
            assert reply.headers.get("www-authenticate") == "Bearer"
            refused.append(reply.status)
        allowed.append((await connection.request(method, path, body, AUTH)).status)
    for method, path in PROBES:
        probes.append((await connection.request(method, path)).status)
    await connection.close()
    return refused, probes, allowed


def test_no_error_body_carries_a_traceback_a_path_or_the_models_message(tmp_path: Path) -> None:
    marker = tmp_path / "setup-attempts"
    options = ("--auth-token", TOKEN, "--max-body-bytes", "1000")
    with serving("fragile_poison", *options, env={MARKER_ENV: str(marker)}) as server:
        marker.touch()  # a worker started from now on dies in setup: killed, the stage stays down
        replies = run(errors_of_every_kind(server.address, server.process.pid))
    statuses = {name: reply.status for name, reply in replies.items()}
    leaks = {name: r.body[:200] for name, r in replies.items() if LEAKS.search(r.body.decode())}
    report("error bodies", statuses=statuses, leaks=len(leaks))
    assert statuses == {
        "malformed": 400,
        "no token": 401,
        "no route": 404,
        "wrong method": 405,
        "not acceptable": 406,
        "too large": 413,
        "unsupported type": 415,
        "invalid": 422,
        "model error": 500,
        "deadline": 504,
        "no live worker": 503,
    }
    assert not leaks, leaks
    for reply in replies.values():
        error = msgspec.json.decode(reply.body)
        assert set(error) == {"error", "message", "request_id"} and error["message"]


async def errors_of_every_kind(address: tuple[str, int], pid: int) -> dict[str, Reply]:
    connection = await Connection.open(address)
    json = {"content-type": "application/json", **AUTH}
    post = connection.request
    replies = {
        "malformed": await post("POST", "/predict", b'{"id": ', json),
        "no token": await post("POST", "/predict", b'{"id": 1}', {}),
        "no route": await post("GET", "/admin", b"", AUTH),
        "wrong method": await post("GET", "/predict", b"", AUTH),
        "not acceptable": await post("POST", "/predict", b'{"id": 1}', {**json, "accept": "x/y"}),
        "too large": await post("POST", "/predict", b" " * 2000, json),
        "unsupported type": await post("POST", "/predict", b"1", {**AUTH, "content-type": "a/b"}),
        "invalid": await post("POST", "/predict", b'{"id": "one"}', json),
        "model error": await connection.post(Job(1, poison=True), AUTH),
        "deadline": await connection.post(Job(2), {**AUTH, "x-request-timeout-ms": "0.001"}),
    }
    for worker in children(pid):  # the whole stage dies: 503
        os.kill(worker, signal.SIGKILL)

    async def stage_down() -> bool:
        return await metric(address, "microbatch_ready") == 0

    await eventually(stage_down, "the stage is down")
    replies["no live worker"] = await connection.post(Job(3), AUTH)
    await connection.close()
    return replies
