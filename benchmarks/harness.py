"""What the HTTP benchmarks share: contenders in their own virtualenvs, servers started
in their own process groups and stopped by that group's id, and ``wrk`` runs.

Used by ``benchmarks/http_serving.py`` (simple workloads), ``benchmarks/real_model.py``
(the embedding model) and ``benchmarks/ray_serving.py``. Load goes only to 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVERS = HERE / "servers"
VENVS = HERE / ".venvs"
RESULTS = HERE / "results"

READY_TIMEOUT_S = 180.0
SERVING_LINE = "microbatch serving on http://127.0.0.1:"
SINGLE_THREAD_BLAS = {
    name: "1"
    for name in (
        "OPENBLAS_NUM_THREADS",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
    )
}
VERSIONS_OF = ("microbatch", "mosec", "litserve", "fastapi", "uvicorn", "numpy")
"""Packages whose versions :func:`versions` reports by default."""


@dataclass(frozen=True)
class Contender:
    """A server under test: how to install it, start it, and reach it.

    Attributes:
        name: Its label, and the name of its virtualenv under ``benchmarks/.venvs/``.
        framework: How it is started: ``microbatch`` (``microbatch serve SERVER``),
            ``mosec`` (``python SERVER --address 127.0.0.1 --port PORT``), or any
            other (``python SERVER PORT``).
        server: ``MODULE:ATTR`` for microbatch, else a script in ``benchmarks/servers/``.
        packages: What ``pip install`` gets.
        predict_path: Where requests are POSTed.
        health_path: What answers 200 once it is ready.
        settings: What it got, for the report.
        first: Installed before ``packages``, in a pip run of their own (a pinned torch).
        options: More arguments for ``microbatch serve`` (e.g. ``--workers 2``).
        venv_name: The virtualenv to use, if not the one named after it (variants of
            one framework share one).
    """

    name: str
    framework: str
    server: str
    packages: tuple[str, ...]
    predict_path: str
    health_path: str
    settings: str
    first: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    venv_name: str | None = None

    @property
    def venv(self) -> Path:
        """Its virtualenv."""
        return VENVS / (self.venv_name or self.name)

    @property
    def python(self) -> Path:
        """The virtualenv's interpreter."""
        return self.venv / "bin" / "python"

    def command(self, port: int) -> list[str]:
        """The server's argv (``port`` unused for microbatch: it reports the port it got)."""
        if self.framework == "microbatch":
            return [
                str(self.venv / "bin" / "microbatch"),
                "serve",
                self.server,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                *self.options,
            ]
        script = str(SERVERS / self.server)
        if self.framework == "mosec":
            return [str(self.python), script, "--address", "127.0.0.1", "--port", str(port)]
        return [str(self.python), script, str(port)]


# -- virtualenvs ---------------------------------------------------------------------


def ensure_venv(contender: Contender) -> None:
    """Create ``benchmarks/.venvs/NAME`` and install the contender, unless done before
    with the same packages (a ``.installed`` marker holds what was installed)."""
    marker = contender.venv / ".installed"
    wanted = " ".join(contender.first + contender.packages)
    if marker.exists() and marker.read_text() == wanted:
        return
    print(f"[{contender.name}] creating {contender.venv}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(contender.venv)], check=True)
    pip = [str(contender.python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    if contender.first:
        subprocess.run([*pip, *contender.first], check=True)
    subprocess.run([*pip, *contender.packages], check=True)
    marker.write_text(wanted)


def versions(contender: Contender, keep: tuple[str, ...] = VERSIONS_OF) -> str:
    """Versions of the packages that matter, for the report."""
    out = subprocess.run(
        [str(contender.python), "-m", "pip", "list", "--format", "freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return ", ".join(line for line in out.splitlines() if line.lower().startswith(keep))


def microbatch_serve_available(contender: Contender) -> bool:
    """Whether this checkout has ``microbatch serve`` (it lands with issue 4)."""
    probe = subprocess.run(
        [str(contender.venv / "bin" / "microbatch"), "serve", "--help"],
        capture_output=True,
        text=True,
    )
    return probe.returncode == 0


def machine() -> str:
    """A one-line description of this machine, for reports."""
    return f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}"


# -- servers -------------------------------------------------------------------------


@dataclass
class Running:
    """A started server: its process (a group leader), URL base and log file."""

    process: subprocess.Popen[str]
    base: str
    log: Path


def free_port() -> int:
    """A port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serving(contender: Contender, env: Mapping[str, str], log: Path) -> Iterator[Running]:
    """Start the server with ``env`` added to ours, wait until its health URL answers
    200, stop it on exit. Its output goes to ``log``."""
    port = free_port()
    environment = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    environment.pop("VIRTUAL_ENV", None)
    microbatch = contender.framework == "microbatch"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            contender.command(port),
            cwd=SERVERS,
            env=environment,
            stdout=subprocess.PIPE if microbatch else sink,
            stderr=sink,
            text=True,
            start_new_session=True,  # its own process group: stopped as one, by our pid
        )
    try:
        if microbatch:
            port = _announced_port(process, log)
        running = Running(process, f"http://127.0.0.1:{port}", log)
        _wait_ready(running, contender.health_path)
        yield running
    finally:
        stop(process)


def _announced_port(process: subprocess.Popen[str], log: Path) -> int:
    """Read stdout until the ``microbatch serving on`` line; copy the rest to the log."""
    assert process.stdout is not None
    found: list[int] = []
    announced = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        with open(log, "a") as sink:
            for line in process.stdout:
                sink.write(line)
                sink.flush()
                if not found and line.startswith(SERVING_LINE):
                    found.append(int(line[len(SERVING_LINE) :].strip().split("/")[0]))
                    announced.set()
        announced.set()

    threading.Thread(target=pump, daemon=True).start()
    if not announced.wait(READY_TIMEOUT_S) or not found:
        raise RuntimeError(f"microbatch serve did not announce its port; see {log}")
    return found[0]


def _wait_ready(running: Running, health_path: str) -> None:
    """Ask the health URL until it answers 200 (the harness may poll; the servers don't)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            raise RuntimeError(
                f"the server exited ({running.process.returncode}); see {running.log}"
            )
        try:
            with urllib.request.urlopen(running.base + health_path, timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"not ready after {READY_TIMEOUT_S:.0f} s; see {running.log}")


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM the server's process group, then SIGKILL it if still there after 10 s."""
    if process.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(10)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # workers left behind by the leader
    process.wait()


# -- load ----------------------------------------------------------------------------

LUA_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "non2xx": %d, "connect": %d, ' ..
    '"read": %d, "write": %d, "timeout": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"mean_us": %.1f, "max_us": %d}\\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean, latency.max))
end
"""
"""wrk's ``done`` hook: one ``WRKJSON {...}`` line that :func:`run_wrk` reads back."""


def run_wrk(url: str, script: Path, connections: int, seconds: float) -> dict[str, Any]:
    """One closed-loop wrk run; its summary (latencies in us, counts)."""
    threads = min(2, connections)
    command = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        url,
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("WRKJSON "):
            summary: dict[str, Any] = json.loads(line[len("WRKJSON ") :])
            return summary
    raise RuntimeError(f"wrk printed no summary:\n{out}")


def fmt(value: float | None) -> str:
    """A number with one decimal, or ``n/a``."""
    return "n/a" if value is None else f"{value:.1f}"


# -- CPU -----------------------------------------------------------------------------

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime


def group_cpu_s(leader: int) -> float:
    """CPU seconds used so far by every live process of ``leader``'s process group."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == leader:  # pgrp
            total += (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
    return total
