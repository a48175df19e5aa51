"""A ``microbatch serve`` child process for the tests that need a real server: started
on ``--port 0``, its URL read from the first line it prints, its readiness awaited,
and at the end killed by its PID if it still runs, waited for, its stdout closed.

Shared by ``tests/serve``, ``tests/ops`` and ``tests/protocols``. Timeouts here are
hang guards, never pass criteria.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

__all__ = ["ROOT", "SERVING_ON", "Server", "serve_command", "stop", "url_from_first_line"]

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root: the servers' working directory."""

SERVING_ON = "microbatch serving on "
"""What a server's first line on stdout starts with, before its URL."""


class Server:
    """A ``microbatch serve`` child process and the URL it printed.

    Args:
        process: The child process.
        url: Its base URL (``http://host:port``).
        hang_guard_s: Longest wait in :meth:`wait_ready`.
    """

    def __init__(
        self, process: subprocess.Popen[str], url: str, hang_guard_s: float = 30.0
    ) -> None:
        self.process = process
        self.url = url
        self.hang_guard_s = hang_guard_s
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.address = (host, int(port))

    def wait_ready(self) -> None:
        """Until /health/ready answers 200 (bounded by the hang guard)."""
        give_up = time.monotonic() + self.hang_guard_s
        with httpx.Client(base_url=self.url) as client:
            while client.get("/health/ready").status_code != 200:
                assert time.monotonic() < give_up, "the server never became ready"
                time.sleep(0.05)


def serve_command(*argv: str) -> list[str]:
    """``python -m microbatch serve ARGV`` with this interpreter."""
    return [sys.executable, "-m", "microbatch", "serve", *argv]


def url_from_first_line(process: subprocess.Popen[str], log: Path | None = None) -> str:
    """The URL that a starting server printed on its first line (``log``: a file whose
    text explains a wrong first line)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    told = "" if log is None else f": {log.read_text()}"
    assert line.startswith(SERVING_ON), f"unexpected first line {line!r}{told}"
    return line.removeprefix(SERVING_ON).strip()


def stop(process: subprocess.Popen[str], hang_guard_s: float) -> None:
    """Kill ``process`` (by its PID) if it still runs, wait for it, close its stdout."""
    if process.poll() is None:
        process.kill()
    process.wait(hang_guard_s)
    if process.stdout is not None:
        process.stdout.close()
