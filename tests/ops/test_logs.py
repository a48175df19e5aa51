"""Issue 19, logs: one format for every logger (text or JSON), the request id on the
lines logged while serving a request, the access log, repeated model errors
rate-limited, and worker deaths, restarts and setup failures at warning level."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import microbatch
from microbatch.http import HttpApp, HttpConfig, app
from microbatch.http.access_log import log_access
from microbatch.http.error_log import RepeatedErrorLog
from microbatch.logs import configure, current_request_id
from microbatch.pipeline.failures import exit_description
from microbatch.testing import FakeClock
from tests.http import models
from tests.http.conftest import serving
from tests.integration.pipeline_models import RaisesInSetup

from .server import logged_server


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure() replaces the root logger's handlers: put pytest's back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    uvicorn = logging.getLogger("uvicorn")
    uvicorn_state = (list(uvicorn.handlers), uvicorn.propagate)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    uvicorn.handlers[:], uvicorn.propagate = uvicorn_state


def test_json_lines_carry_level_logger_request_id_extras_and_traceback(
    restore_logging: None,
) -> None:
    stream = io.StringIO()
    configure("info", "json", stream)
    token = current_request_id.set("abc-123")
    try:
        logging.getLogger("microbatch.access").info("GET / 200", extra={"status": 200})
        try:
            raise KeyError("boom")
        except KeyError:
            logging.getLogger("user.code").exception("it failed")
    finally:
        current_request_id.reset(token)
    logging.getLogger("uvicorn.error").warning("from uvicorn")
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["logger"] == "microbatch.access" and first["level"] == "INFO"
    assert first["request_id"] == "abc-123" and first["status"] == 200
    assert first["time"].endswith("Z")
    assert second["message"] == "it failed" and "KeyError: 'boom'" in second["traceback"]
    assert third["logger"] == "uvicorn.error" and "request_id" not in third


def test_text_lines_name_the_request(restore_logging: None) -> None:
    stream = io.StringIO()
    configure("warning", "text", stream)
    token = current_request_id.set("r-1")
    try:
        logging.getLogger("microbatch.x").warning("look %s", "here")
        logging.getLogger("microbatch.x").info("not shown")
    finally:
        current_request_id.reset(token)
    (line,) = stream.getvalue().splitlines()
    assert line.endswith("WARNING microbatch.x: look here request_id=r-1")


def test_a_text_access_line_says_it_all_once(restore_logging: None) -> None:
    stream = io.StringIO()
    configure("info", "text", stream)
    scope = {"method": "POST", "path": "/predict", "client": ("10.0.0.9", 5123)}
    log_access(scope, 200, 0.0123, "req-9")
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(
        "INFO microbatch.access: 10.0.0.9:5123 POST /predict 200 12.3ms request_id=req-9"
    )


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="xml"):
        configure("info", "xml")


def test_exit_descriptions_name_the_signal() -> None:
    assert exit_description(-9) == "killed by signal SIGKILL (9)"
    assert exit_description(3) == "exit code 3"
    assert exit_description(None) == "exit code unknown"


# -- the request id and the access log (in-process app) --------------------------------


async def test_the_clients_request_id_is_echoed_on_every_response_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "microbatch.access")
    given = {"x-request-id": "client-42.a_b:c"}
    async with serving(HttpApp(models.double, HttpConfig(access_log=True))) as client:
        ok = await client.post("/predict", json={"x": 1}, headers=given)
        missing = await client.get("/nowhere", headers=given)
        probe = await client.get("/health/live", headers=given)
        failed = await client.post("/predict", json={"x": 13}, headers=given)
    for reply in (ok, missing, probe, failed):
        assert reply.headers["x-request-id"] == "client-42.a_b:c"
    assert failed.status_code == 500 and failed.json()["request_id"] == "client-42.a_b:c"
    access = [r for r in caplog.records if r.name == "microbatch.access"]
    assert [(r.method, r.path, r.status) for r in access] == [  # type: ignore[attr-defined]
        ("POST", "/predict", 200),
        ("GET", "/nowhere", 404),
        ("GET", "/health/live", 200),
        ("POST", "/predict", 500),
    ]
    assert {r.request_id for r in access} == {"client-42.a_b:c"}  # type: ignore[attr-defined]
    (traceback_line,) = [r for r in caplog.records if r.name == "microbatch.http"]
    assert traceback_line.request_id == "client-42.a_b:c"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "given",
    ["x" * 129, "has space", 'quote"d', "new\nline", "", "caf\u00e9"],
    ids=["too-long", "space", "quote", "newline", "empty", "non-ascii"],
)
async def test_an_unsafe_request_id_is_replaced_by_a_fresh_one(given: str) -> None:
    async with serving(app(models.double)) as client:
        reply = await client.get("/health/live", headers=[(b"x-request-id", given.encode("utf-8"))])
    echoed = reply.headers["x-request-id"]
    assert echoed != given and 1 <= len(echoed) <= 128


async def test_requests_without_an_id_get_distinct_ones_and_no_access_log_by_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    async with serving(app(models.double)) as client:
        replies = await asyncio.gather(*(client.get("/health/live") for _ in range(20)))
    assert len({r.headers["x-request-id"] for r in replies}) == 20
    assert not [r for r in caplog.records if r.name == "microbatch.access"]


async def test_a_model_failing_every_request_logs_one_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(app(models.double)) as client:
        replies = [await client.post("/predict", json={"x": 13}) for _ in range(30)]
    assert {r.status_code for r in replies} == {500}
    assert all("Traceback" not in r.text and "secret" not in r.text for r in replies)
    lines = [r.getMessage() for r in caplog.records if r.name == "microbatch.http"]
    assert sum("Traceback" in line for line in lines) == 1
    # The count of the others is logged when the app shuts down (flush).
    assert any("29 more time(s)" in line for line in lines), lines


def test_repeats_are_counted_and_reported_once_per_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    log = RepeatedErrorLog(logging.getLogger("test.errors"), clock.now, window_s=60.0)

    def fail(request_id: str, message: str) -> None:
        try:
            raise ValueError(message)  # the same frames every time
        except ValueError as error:
            log.failed(request_id, error)

    with caplog.at_level(logging.ERROR, "test.errors"):
        fail("r1", "first")
        for n in range(5):
            fail(f"r{n + 2}", "other message, same place")
        clock.advance(59.0)
        assert len(caplog.records) == 1
        fail("r7", "x")  # 59 s: still counted
        clock.advance(1.0)
        fail("r8", "x")  # 60 s: one line with the count
        try:
            raise KeyError("elsewhere")
        except KeyError as error:
            log.failed("r9", error)
        log.flush()  # nothing left to report
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3, lines
    assert "Traceback" in lines[0] and "r1" in lines[0]
    assert "ValueError 7 more time(s) in the last 60 s" in lines[1] and "request r1" in lines[1]
    assert "KeyError" in lines[2] and "Traceback" in lines[2]


# -- workers ---------------------------------------------------------------------------


class _Waiter(logging.Handler):
    """Sets an event once records containing each of ``texts`` were logged."""

    def __init__(self, *texts: str) -> None:
        super().__init__(logging.WARNING)
        self.texts = texts
        self.seen = asyncio.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if all(any(text in m for m in self.messages) for text in self.texts):
            self.seen.set()


async def test_a_killed_worker_and_its_restart_are_logged_as_warnings() -> None:
    service = microbatch.Service(microbatch.Stage(models.Double), examples=[models.Point(1)])
    waiter = _Waiter("started again", "died")
    workers_logger = logging.getLogger("microbatch.workers")
    workers_logger.addHandler(waiter)
    try:
        async with service:
            (pid,) = service.pools[0].pids
            os.kill(pid, signal.SIGKILL)
            async with asyncio.timeout(60):
                await waiter.seen.wait()
    finally:
        workers_logger.removeHandler(waiter)
    (died,) = [m for m in waiter.messages if "died" in m]
    (restarted,) = [m for m in waiter.messages if "started again" in m]
    assert f"stage 'Double': worker 0 (pid {pid}) died, killed by signal SIGKILL (9)" in died
    assert "starting it again" in died
    assert restarted == "stage 'Double': worker 0 started again (restart 1 of this stage)"


async def test_a_setup_failure_is_logged_with_the_traceback_into_the_users_code(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = microbatch.Service(microbatch.Stage(RaisesInSetup, setup_attempts=2))
    with pytest.raises(microbatch.StageFailed):
        await service.start()
    await service.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "microbatch.workers"]
    assert len(warnings) == 2
    assert "attempt 1 of 2" in warnings[0] and "attempt 2 of 2" in warnings[1]
    assert "pipeline_models.py" in warnings[0] and "no weights at /nowhere" in warnings[0]
    assert "microbatch/pipeline/worker.py" not in warnings[0]


# -- a real server -------------------------------------------------------------------


def test_a_real_server_logs_json_with_access_lines_and_echoes_the_id(tmp_path: Path) -> None:
    with logged_server(
        tmp_path, "tests.http.models:double", "--log-format", "json", "--access-log"
    ) as server:
        reply = httpx.post(
            f"{server.url}/predict", json={"x": 2}, headers={"X-Request-ID": "trace-me-1"}
        )
        assert reply.status_code == 200 and reply.headers["x-request-id"] == "trace-me-1"
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(60) == 0
    entries = [json.loads(line) for line in server.log_lines()]  # every line is JSON
    access = [e for e in entries if e["logger"] == "microbatch.access"]
    assert any(
        e["request_id"] == "trace-me-1" and e["path"] == "/predict" and e["status"] == 200
        for e in access
    ), access
    assert len({e["logger"] for e in entries}) >= 2  # one format for every logger


async def test_our_own_500s_are_not_blamed_on_the_model(caplog: pytest.LogCaptureFixture) -> None:
    async with serving(app(models.unencodable)) as client:
        reply = await client.post("/predict", json=1)
    assert reply.status_code == 500
    (line,) = [r.getMessage() for r in caplog.records if r.name == "microbatch.http"]
    assert "failed with UnencodableResult" in line and "model raised" not in line
