"""Issue 19, ``microbatch top``: parsing /metrics, the figures between two scrapes,
the screen, the keyboard, and the whole command driven in a real terminal (tmux)."""

from __future__ import annotations

import math
import os
import pty
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from microbatch.top.live import Keys, describe_failure, metrics_url
from microbatch.top.screen import render, render_unreachable
from microbatch.top.snapshot import parse_metrics
from microbatch.top.view import quantile, view_between

from .server import HANG_GUARD_S, ROOT, logged_server


def exposition(requests_200: int, latency: list[int], sizes: list[int], restarts: int) -> str:
    """A server's /metrics text: latency counts per bucket of 1, 2, 4 ms and +Inf,
    batch sizes per bucket of 1, 2, 4 and +Inf (not cumulative here)."""

    def cumulative(counts: list[int]) -> list[int]:
        return [sum(counts[: i + 1]) for i in range(len(counts))]

    lines = [
        "# TYPE microbatch_ready gauge",
        "microbatch_ready 1.0",
        "# TYPE microbatch_items_in_service gauge",
        "microbatch_items_in_service 3.0",
        "# TYPE microbatch_http_requests counter",
        f'microbatch_http_requests_total{{route="/predict",status="200"}} {requests_200}',
        'microbatch_http_requests_total{route="/predict",status="503"} 5',
        "# TYPE microbatch_http_request_duration_seconds histogram",
    ]
    for bound, count in zip(("0.001", "0.002", "0.004", "+Inf"), cumulative(latency), strict=True):
        labels = f'route="/predict",le="{bound}"'
        lines.append(f"microbatch_http_request_duration_seconds_bucket{{{labels}}} {count}")
    lines += [
        f'microbatch_http_request_duration_seconds_count{{route="/predict"}} {sum(latency)}',
        'microbatch_http_request_duration_seconds_sum{route="/predict"} 1.0',
        "# TYPE microbatch_queue_depth gauge",
        'microbatch_queue_depth{stage="embed"} 7.0',
        "# TYPE microbatch_in_flight_items gauge",
        'microbatch_in_flight_items{stage="embed"} 16.0',
        "# TYPE microbatch_workers_alive gauge",
        'microbatch_workers_alive{stage="embed"} 2.0',
        "# TYPE microbatch_worker_restarts counter",
        f'microbatch_worker_restarts_total{{stage="embed"}} {restarts}',
        "# TYPE microbatch_batches counter",
        f'microbatch_batches_total{{stage="embed"}} {sum(sizes)}',
        "# TYPE microbatch_items_dropped counter",
        'microbatch_items_dropped_total{stage="embed",reason="deadline"} 4',
        "# TYPE microbatch_batch_size histogram",
    ]
    for bound, count in zip(("1", "2", "4", "+Inf"), cumulative(sizes), strict=True):
        lines.append(f'microbatch_batch_size_bucket{{stage="embed",le="{bound}"}} {count}')
    items = sizes[0] * 1 + sizes[1] * 2 + sizes[2] * 4 + sizes[3] * 8
    lines += [
        f'microbatch_batch_size_count{{stage="embed"}} {sum(sizes)}',
        f'microbatch_batch_size_sum{{stage="embed"}} {items}',
        "# EOF",
    ]
    return "\n".join(lines) + "\n"


def test_a_scrape_is_parsed_into_numbers() -> None:
    snapshot = parse_metrics(exposition(100, [10, 20, 30, 40], [1, 2, 3, 4], 1), taken_at=5.0)
    assert snapshot.ready and snapshot.items_in_service == 3
    assert snapshot.requests[("/predict", "200")] == 100
    assert snapshot.latencies["/predict"] == (
        (0.001, 10),
        (0.002, 30),
        (0.004, 60),
        (math.inf, 100),
    )
    stage = snapshot.stages["embed"]
    assert (stage.queue_depth, stage.in_flight_items, stage.workers_alive) == (7, 16, 2)
    assert (stage.restarts, stage.batches, stage.dropped) == (1, 10, {"deadline": 4})
    assert stage.batch_sizes[-1] == (math.inf, 10)


def test_rates_percentiles_and_distribution_cover_only_the_interval() -> None:
    before = parse_metrics(exposition(100, [100, 0, 0, 0], [10, 0, 0, 0], 1), taken_at=10.0)
    after = parse_metrics(exposition(300, [100, 0, 200, 0], [10, 0, 30, 10], 3), taken_at=12.0)
    view = view_between(before, after)
    assert view.seconds == 2.0 and view.requests_per_s == 100.0
    assert view.statuses_per_s == {"200": 100.0, "503": 0.0}
    # All 200 requests of the interval took 2 to 4 ms: the fast ones before do not count.
    assert 0.002 < view.p50_s < 0.004 and 0.002 < view.p99_s <= 0.004
    stage = view.stages["embed"]
    assert stage.batches_per_s == 20.0
    assert stage.mean_batch_size == (30 * 4 + 10 * 8) / 40
    assert dict(stage.batch_sizes) == {1: 0.0, 2: 0.0, 4: 0.75, math.inf: 0.25}
    assert (stage.restarts, stage.new_restarts) == (3, 2)


def test_the_first_scrape_has_no_rates_and_shows_everything_so_far() -> None:
    view = view_between(None, parse_metrics(exposition(10, [10, 0, 0, 0], [4, 0, 0, 0], 0), 1.0))
    assert math.isnan(view.requests_per_s) and view.p99_s <= 0.001
    assert view.stages["embed"].mean_batch_size == 1.0


def test_with_no_batch_in_the_interval_the_sizes_are_those_since_start() -> None:
    text = exposition(10, [10, 0, 0, 0], [0, 6, 2, 0], 0)
    view = view_between(parse_metrics(text, 1.0), parse_metrics(text, 2.0))
    assert dict(view.stages["embed"].batch_sizes)[2] == 0.75
    assert view.stages["embed"].batches_per_s == 0.0


def test_quantiles_interpolate_as_prometheus_does() -> None:
    buckets = ((1.0, 50.0), (2.0, 100.0), (math.inf, 100.0))
    assert quantile(0.5, buckets) == 1.0
    assert quantile(0.75, buckets) == 1.5
    assert quantile(0.99, ((1.0, 0.0), (math.inf, 10.0))) == 1.0  # in +Inf: the top bound
    assert math.isnan(quantile(0.5, ((1.0, 0.0), (math.inf, 0.0))))


def screen_text(renderable: object) -> str:
    console = Console(record=True, width=130, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_screen_shows_every_figure() -> None:
    before = parse_metrics(exposition(100, [100, 0, 0, 0], [10, 0, 0, 0], 1), taken_at=10.0)
    after = parse_metrics(exposition(300, [100, 0, 200, 0], [10, 0, 30, 10], 3), taken_at=12.0)
    text = screen_text(render("http://h:1/metrics", view_between(before, after), 1.0))
    for expected in ("READY", "/predict req/s", "100", "ms", "embed", " 20 ", "3 (+2)", "75%"):
        assert expected in text, (expected, text)
    down = screen_text(render_unreachable("http://h:1/metrics", "connection refused", 2.0))
    assert "cannot read http://h:1/metrics" in down and "connection refused" in down
    assert "Is `microbatch serve` running there?" in down


def test_urls_and_failures_are_told_plainly() -> None:
    assert metrics_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("127.0.0.1:8000/") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://h/x/metrics") == "http://h/x/metrics"
    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    assert describe_failure(refused) == "connection refused"
    unauthorized = urllib.error.HTTPError("u", 401, "Unauthorized", None, None)  # type: ignore[arg-type]
    assert "token" in describe_failure(unauthorized)


def test_keys_wait_for_q_on_a_terminal() -> None:
    controller, terminal = pty.openpty()
    with os.fdopen(terminal, "r") as stream:
        keys = Keys(stream)
        with keys.reading():
            assert not keys.quit_within(0.01)  # nothing typed
            os.write(controller, b"xq")
            assert keys.quit_within(HANG_GUARD_S)
    os.close(controller)


# -- a real terminal --------------------------------------------------------------------


SCREEN_GUARD_S = 30.0  # longest wait for the screen to show something (a hang guard)


class Tmux:
    """A tmux server of this test's own (its socket in the test's directory), one
    window running a command."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path

    def run(self, *args: str) -> str:
        # Output to a file, not a pipe: a new session's server inherits it and
        # would hold a pipe open for as long as it runs.
        with tempfile.TemporaryFile("w+") as out:
            subprocess.run(
                ["tmux", "-S", str(self.socket_path), "-f", "/dev/null", *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=HANG_GUARD_S,
                check=True,
            )
            out.seek(0)
            return out.read()

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "top")

    def wait_for(self, *texts: str) -> str:
        """The screen, once it shows every one of ``texts`` (bounded wait)."""
        give_up = time.monotonic() + SCREEN_GUARD_S
        while not all(text in (screen := self.screen()) for text in texts):
            assert time.monotonic() < give_up, f"never showed {texts}:\n{screen}"
            time.sleep(0.1)
        return screen


@contextmanager
def top_in_tmux(url: str, tmp_path: Path) -> Iterator[Tmux]:
    """``microbatch top URL`` in a 130x40 tmux window; after it exits the window
    says ``top exited with STATUS``."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is needed (apt-get install tmux)")
    tmux = Tmux(tmp_path / "tmux.sock")
    # The window's size, not pytest's COLUMNS and LINES, is the terminal's.
    python = f"env -u COLUMNS -u LINES PYTHONPATH={ROOT / 'src'}:{ROOT} {sys.executable}"
    command = (
        f"cd {ROOT} && {python} -m microbatch top {url} --interval 0.2"
        f" 2>{tmp_path / 'top.err'}; echo top exited with $?; sleep {HANG_GUARD_S}"
    )
    tmux.run("new-session", "-d", "-s", "top", "-x", "130", "-y", "40", command)
    try:
        yield tmux
    finally:
        tmux.run("kill-server")


def test_top_in_a_real_terminal_shows_the_server_and_quits_on_q(tmp_path: Path) -> None:
    with logged_server(tmp_path, "tests.http.models:service") as server:
        for x in range(20):
            assert httpx.post(f"{server.url}/predict", json={"x": x + 0.5}).status_code == 200
        with top_in_tmux(server.url, tmp_path) as tmux:
            screen = tmux.wait_for("READY", "Double", "batches/s", "workers alive", "p99")
            assert "cannot read" not in screen
            tmux.run("send-keys", "-t", "top", "q")
            tmux.wait_for("top exited with 0")
    assert (tmp_path / "top.err").read_text() == ""


def test_top_says_when_the_server_is_down_and_ctrl_c_quits(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with top_in_tmux(url, tmp_path) as tmux:
        tmux.wait_for("cannot read", "connection refused", "Is `microbatch serve` running there?")
        tmux.run("send-keys", "-t", "top", "C-c")
        tmux.wait_for("top exited with 0")
