"""A ``microbatch serve`` child process for the ops tests: its URL from stdout, its
log (stderr) in a file, stopped by its PID only."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.server_process import ROOT, Server, serve_command, stop, url_from_first_line

HANG_GUARD_S = 60.0
"""Longest wait for anything; a guard against hangs, never a pass criterion."""


class LoggedServer(Server):
    """A running server, its URL and the file its log goes to."""

    def __init__(self, process: subprocess.Popen[str], url: str, log: Path) -> None:
        super().__init__(process, url, HANG_GUARD_S)
        self.log = log

    def log_lines(self) -> list[str]:
        """What it has logged so far."""
        return self.log.read_text().splitlines()


@contextmanager
def logged_server(
    tmp_path: Path, *argv: str, env: dict[str, str] | None = None, ready: bool = True
) -> Iterator[LoggedServer]:
    """Start ``python -m microbatch serve ARGV --port 0``; yield once it printed its URL."""
    log = tmp_path / f"server-{time.monotonic_ns()}.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            serve_command(*argv, "--port", "0"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", **(env or {})},
        )
    try:
        server = LoggedServer(process, url_from_first_line(process, log), log)
        if ready:
            server.wait_ready()
        yield server
    finally:
        stop(process, HANG_GUARD_S)
