"""What the reliability tests share: a ``microbatch serve`` child process, the
figures they report, and (re-exported here, one import for every test) the raw HTTP
client (:mod:`.client`), closed- and open-loop load (:mod:`.load`) and readings from
/proc (:mod:`.procfs`).

Load stays on 127.0.0.1 with at most 200 connections. Every wait is bounded by a
hang guard; the tests stop only the processes they started, by PID.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections import Counter
from collections.abc import Awaitable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import uvloop

from tests.conftest import long_figures
from tests.serve.test_server import Server, running

from .client import HANG_GUARD_S, Connection, Reply, eventually, get, metric, sum_samples
from .load import HUNG_UP, Outcome, Tally, closed_loop, open_loop, percentile
from .procfs import (
    RssSamples,
    alive,
    children,
    cpu_wait_s,
    fd_count,
    listening_tcp,
    rss_kib,
    sampling_rss,
    shm_segments,
    unix_socket_paths,
)

__all__ = [
    "HANG_GUARD_S",
    "HUNG_UP",
    "Connection",
    "Outcome",
    "Reply",
    "RssSamples",
    "Server",
    "Tally",
    "alive",
    "children",
    "closed_loop",
    "computed",
    "cpu_wait_s",
    "eventually",
    "fd_count",
    "get",
    "lasting",
    "listening_tcp",
    "metric",
    "open_loop",
    "percentile",
    "report",
    "rss_kib",
    "run",
    "sampling_rss",
    "serving",
    "shm_segments",
    "stop",
    "sum_samples",
    "unix_socket_paths",
]

FIGURES: list[str] = []
"""Every figure reported in this session, printed again in pytest's summary."""


T = TypeVar("T")


def lasting(short_s: float, long_s: float) -> float:
    """A test's duration: ``long_s`` under ``pytest --long`` (the published
    figure), else ``short_s`` (the default run: the same faults, fewer seconds)."""
    return long_s if long_figures() else short_s


def run(main: Awaitable[T]) -> T:
    """Run a test's client side on uvloop (the load generator needs the speed)."""
    return uvloop.run(main)  # type: ignore[arg-type, no-any-return]


def report(name: str, **numbers: object) -> str:
    """Print a test's figure (``name: key=value ...``) and keep it for the summary."""
    line = f"{name}: " + " ".join(f"{key}={_show(value)}" for key, value in numbers.items())
    FIGURES.append(line)
    print(line, flush=True)
    return line


def _show(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        pairs = sorted(value.items(), key=str) if isinstance(value, Counter) else value.items()
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in pairs) + "}"
    return str(value)


@contextlib.contextmanager
def serving(target: str, *options: str, env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """``microbatch serve tests.reliability.models:TARGET --port 0 ...`` until the block
    ends (then SIGTERM, and SIGKILL if it has not exited within the hang guard);
    yields once it is ready. Logs at warning level unless told otherwise."""
    if "--log-level" not in options:
        options = (*options, "--log-level", "warning")
    with running(f"tests.reliability.models:{target}", *options, env=dict(env or {})) as server:
        try:
            yield server
        finally:
            if server.process.poll() is None:
                stop(server)


def stop(server: Server) -> int:
    """SIGTERM the server and wait for it (SIGKILL past the hang guard); its exit status."""
    server.process.terminate()
    try:
        return server.process.wait(HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait(HANG_GUARD_S)


def computed(log: Path) -> dict[int, float]:
    """The items a model of tests.reliability.models computed, from its log: id ->
    when it started (``time.monotonic()``); warm-up items (negative ids) left out."""
    if not log.exists():
        return {}
    started = {}
    for line in log.read_text().splitlines():
        item_id, at = line.split()
        if int(item_id) >= 0:
            started.setdefault(int(item_id), float(at))
    return started
