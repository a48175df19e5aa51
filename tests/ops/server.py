"""A ``microbatch serve`` child process for the ops tests: its URL from stdout, its
log (stderr) in a file, stopped by its PID only."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 60.0
"""Longest wait for anything; a guard against hangs, never a pass criterion."""


class LoggedServer:
    """A running server, its URL and the file its log goes to."""

    def __init__(self, process: subprocess.Popen[str], url: str, log: Path) -> None:
        self.process = process
        self.url = url
        self.log = log

    def log_lines(self) -> list[str]:
        """What it has logged so far."""
        return self.log.read_text().splitlines()

    def wait_ready(self) -> None:
        """Until /health/ready answers 200 (bounded by the hang guard)."""
        give_up = time.monotonic() + HANG_GUARD_S
        with httpx.Client(base_url=self.url) as client:
            while client.get("/health/ready").status_code != 200:
                assert time.monotonic() < give_up, "the server never became ready"
                time.sleep(0.05)


@contextmanager
def logged_server(
    tmp_path: Path, *argv: str, env: dict[str, str] | None = None, ready: bool = True
) -> Iterator[LoggedServer]:
    """Start ``python -m microbatch serve ARGV --port 0``; yield once it printed its URL."""
    log = tmp_path / f"server-{time.monotonic_ns()}.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "microbatch", "serve", *argv, "--port", "0"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", **(env or {})},
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        prefix = "microbatch serving on "
        assert line.startswith(prefix), f"unexpected first line {line!r}: {log.read_text()}"
        server = LoggedServer(process, line.removeprefix(prefix).strip(), log)
        if ready:
            server.wait_ready()
        yield server
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(HANG_GUARD_S)
        if process.stdout is not None:
            process.stdout.close()
