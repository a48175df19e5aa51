"""The README's main command runs and reports what it formed."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_and_reports_batches() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "microbatch", "demo", "--seconds", "0.3", "--callers", "64"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "64 asyncio callers" in done.stdout
    assert "32 threads" in done.stdout
    assert done.stdout.count("mean batch") == 2
    assert "items/s" in done.stdout


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "microbatch", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0
    assert done.stdout.startswith("microbatch ")
