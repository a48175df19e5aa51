"""The probe behind issue 15's choice of HTTP front: the same 40-line ``{"x"} -> {"y"}``
app on our own uvloop + httptools protocol and on granian (RSGI, one worker), and
``microbatch serve`` itself over a servable that answers at once (the whole front:
connection layer, app, metrics; no batching), driven by wrk at 64 connections;
requests per second and CPU per request of the serving process group (``/proc``
utime + stime over the run, divided by requests).

Run (creates ``benchmarks/.venvs/granian`` when missing)::

    flock /work/bench.lock python3 benchmarks/front_probe.py --seconds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import LUA_DONE, ROOT, SERVERS, VENVS, free_port, group_cpu_s, run_wrk, stop

LUA = """
local counter = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  counter = counter + 1
  return wrk.format(nil, nil, nil, '{"x": ' .. (counter + 0.5) .. '}')
end
"""


def ensure_granian() -> Path:
    """The granian virtualenv's bin directory (created when missing)."""
    venv = VENVS / "granian"
    if not (venv / "bin" / "granian").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "granian", "msgspec", "uvloop"], check=True)
    return venv / "bin"


def commands(port: int) -> dict[str, list[str]]:
    """How each probe is started."""
    granian = ensure_granian()
    return {
        "httptools": [sys.executable, str(SERVERS / "probe_httptools.py"), str(port)],
        "microbatch-front": [
            sys.executable,
            "-m",
            "microbatch",
            "serve",
            "echo_servable:servable",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        "granian-rsgi": [
            str(granian / "granian"),
            "--interface",
            "rsgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--loop",
            "uvloop",
            "probe_granian:app",
        ],
    }


def wait_open(port: int, process: subprocess.Popen[bytes]) -> None:
    """Until the port accepts a connection (the probe prints nothing we can wait on
    for granian)."""
    import socket

    for _ in range(300):
        if process.poll() is not None:
            raise RuntimeError("the probe exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the probe never listened")


def main() -> None:
    """Run both probes; print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "probe.lua"
        script.write_text(LUA + LUA_DONE)
        for name in ("httptools", "granian-rsgi", "microbatch-front"):
            port = free_port()
            process = subprocess.Popen(
                commands(port)[name],
                cwd=SERVERS,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": f"{SERVERS}:{ROOT / 'src'}"},
                start_new_session=True,
            )
            try:
                wait_open(port, process)
                url = f"http://127.0.0.1:{port}/predict"
                run_wrk(url, script, args.connections, 1)
                before = group_cpu_s(process.pid)
                summary = run_wrk(url, script, args.connections, args.seconds)
                used = group_cpu_s(process.pid) - before
            finally:
                stop(process)  # type: ignore[arg-type]
            seconds = summary["duration_us"] / 1e6
            rows.append(
                f"| {name} | {args.connections} | {summary['requests'] / seconds:,.0f} | "
                f"{summary['p99_us'] / 1e3:.2f} | {1e6 * used / summary['requests']:.1f} |"
            )
    print("| front | conns | req/s | p99 ms | CPU µs/req |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
