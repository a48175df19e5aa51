"""Lint and type checks run with the tests, so one command checks everything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"


def test_ruff_lint() -> None:
    run("ruff", "check", "src", "tests", "benchmarks", "examples")


def test_ruff_format() -> None:
    run("ruff", "format", "--check", "src", "tests", "benchmarks", "examples")


def test_mypy_strict_on_the_package_and_the_typed_api_examples() -> None:
    run("mypy", "--strict", "src/microbatch", "tests/typing")
