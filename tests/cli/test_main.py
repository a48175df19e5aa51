"""``microbatch``'s entry point: a flag refused in a mode stops the command before
anything starts (no Ray, no server), with argparse's status and message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from microbatch.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ray", "--header-timeout-s", "5"], "--header-timeout-s does not work with serve --ray"),
        (["--ray", "--workers", "4"], "--workers does not work with serve --ray: Ray's replicas"),
        (["--replicas", "2"], "--replicas does not work with serve: "),
    ],
)
def test_a_refused_flag_stops_the_command_naming_flag_and_mode(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["serve", "tests.http.models:double", *flags])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert message in error
    assert error.startswith("usage: microbatch serve")


def test_the_installed_command_refuses_the_same_way() -> None:
    refused = ["--ray", "--header-timeout-s", "5"]
    done = subprocess.run(
        [sys.executable, "-m", "microbatch", "serve", "tests.http.models:double", *refused],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--header-timeout-s does not work with serve --ray" in done.stderr
    assert "Traceback" not in done.stderr
