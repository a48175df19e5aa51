"""What the HTTP benchmarks share: contenders in their own virtualenvs, servers started
in their own process groups and stopped by that group's id, and ``wrk`` runs.

Used by ``benchmarks/http_serving.py`` (simple workloads), ``benchmarks/real_model.py``
(the embedding model), ``benchmarks/ray_serving.py``, ``benchmarks/protocols.py`` and
``benchmarks/embedding_lengths.py``. Load goes only to 127.0.0.1.
"""

from __future__ import annotations

import hashlib
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
from collections.abc import Callable, Iterator, Mapping, Sequence
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
WRK_THREADS = int(os.environ.get("MICROBATCH_BENCH_WRK_THREADS", "2"))
"""wrk's threads (at most one per connection): 2 fits a 2-core machine; give more
cores' machines more, so that the load generator is not the limit."""
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
    with the same packages (a ``.installed`` marker holds what was installed). A
    regular (not editable) install of this checkout, which compiles its hot path, is
    built again whenever the checkout's source changed since."""
    marker = contender.venv / ".installed"
    wanted = " ".join(contender.first + contender.packages)
    if marker.exists() and marker.read_text() == wanted:
        _reinstall_if_changed(contender)
        return
    print(f"[{contender.name}] creating {contender.venv}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(contender.venv)], check=True)
    pip = [str(contender.python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    if contender.first:
        subprocess.run([*pip, *contender.first], check=True)
    subprocess.run([*pip, *contender.packages], check=True)
    marker.write_text(wanted)
    _source_marker(contender).write_text(source_fingerprint())


def source_fingerprint() -> str:
    """A digest of what a regular install of this checkout is built from."""
    digest = hashlib.sha256()
    files = [ROOT / "pyproject.toml", ROOT / "hatch_build.py", *(ROOT / "src").rglob("*.py")]
    for path in sorted(files):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _source_marker(contender: Contender) -> Path:
    return contender.venv / ".source"


def _reinstall_if_changed(contender: Contender) -> None:
    """Build this checkout into the venv again where it is installed regularly (not
    with ``-e``) and its source changed since it was."""
    packages = contender.packages
    regular = [
        package
        for at, package in enumerate(packages)
        if package.startswith(str(ROOT)) and (at == 0 or packages[at - 1] != "-e")
    ]
    marker = _source_marker(contender)
    if not regular or (marker.exists() and marker.read_text() == source_fingerprint()):
        return
    print(f"[{contender.name}] installing this checkout again (its source changed)", flush=True)
    pip = [str(contender.python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--no-deps", "--force-reinstall", *regular], check=True)
    check = subprocess.run([str(contender.python), "-m", "pip", "check"], capture_output=True)
    if check.returncode != 0:  # the checkout needs a package the venv lacks: resolve again
        subprocess.run([*pip, *regular], check=True)
    marker.write_text(source_fingerprint())


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
        wait_ready(running.base + contender.health_path, process, log)
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


def wait_ready(url: str, process: subprocess.Popen[Any], log: Path) -> None:
    """Ask ``url`` until it answers 200 (the harness may poll; the servers don't);
    raise if ``process`` exits first or after :data:`READY_TIMEOUT_S`."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:  # refused, reset, timed out: not up yet
            pass
        time.sleep(0.2)
    raise RuntimeError(f"not ready after {READY_TIMEOUT_S:.0f} s; see {log}")


def post_json(url: str, value: Any, timeout_s: float) -> tuple[int, Any]:
    """POST ``value`` as JSON; the reply's status and decoded JSON body (a status of
    400 or more raises :class:`urllib.error.HTTPError`)."""
    request = urllib.request.Request(
        url, json.dumps(value).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        return int(reply.status), json.loads(reply.read())


def metrics_text(base: str) -> str:
    """The server's Prometheus ``/metrics`` page."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as reply:
        return str(reply.read().decode())


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


def bodies_script(bodies: Sequence[bytes], path: Path) -> Path:
    """Write a wrk script to ``path`` that POSTs the JSON ``bodies`` in turn (each
    connection from the first); it reports through :data:`LUA_DONE`."""
    entries = ",\n".join(f"[==[{body.decode()}]==]" for body in bodies)
    path.write_text(
        f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"local bodies = {{\n{entries}\n}}\nlocal counter = 0\n"
        "request = function()\n  counter = counter % #bodies + 1\n"
        "  return wrk.format(nil, nil, nil, bodies[counter])\nend\n" + LUA_DONE
    )
    return path


def run_wrk(url: str, script: Path, connections: int, seconds: float) -> dict[str, Any]:
    """One closed-loop wrk run; its summary (latencies in us, counts)."""
    threads = min(WRK_THREADS, connections)
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


def wrk_row(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A :func:`run_wrk` summary as a report's row: req/s, p50 and p99 in ms, non-2xx
    answers, socket errors."""
    return {
        "req_per_s": summary["requests"] / (summary["duration_us"] / 1e6),
        "p50_ms": summary["p50_us"] / 1e3,
        "p99_ms": summary["p99_us"] / 1e3,
        "non2xx": summary["non2xx"],
        "socket_errors": sum(summary[k] for k in ("connect", "read", "write", "timeout")),
    }


def pyplot_or_none() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or None (and a note on stderr) where
    matplotlib is not installed: the reports draw only where they can."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)", file=sys.stderr)
        return None
    return plt


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


def cpu_s_below(root: int, role: Callable[[bytes], str]) -> dict[str, float]:
    """CPU seconds so far of every live process below ``root`` (its descendants),
    summed by ``role`` of each one's command line."""
    parents: dict[int, int] = {}
    info: dict[int, tuple[bytes, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        info[pid] = (command, int(fields[11]) + int(fields[12]))  # utime + stime
    totals: dict[str, int] = {}
    for pid, (command, ticks) in info.items():
        ancestor = parents.get(pid, 0)
        while ancestor not in (0, 1, root):
            ancestor = parents.get(ancestor, 0)
        if ancestor == root:
            name = role(command)
            totals[name] = totals.get(name, 0) + ticks
    return {name: ticks / _TICKS_PER_S for name, ticks in totals.items()}
