"""``microbatch bench`` end to end, against ``microbatch serve`` on a free port of 127.0.0.1.

One server for the module, stopped by its PID. Runs are short; the numbers are
checked for structure and sanity (counts add up, percentiles ordered, batches of at
least one), never for speed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 60.0
SERVING = "microbatch serving on "


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """Serve ``tests.bench.service:service`` on port 0; yield its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "microbatch", "serve", "tests.bench.service:service", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith(SERVING), f"unexpected first line {line!r}"
        yield line.removeprefix(SERVING).strip()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(HANG_GUARD_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(HANG_GUARD_S)
        if process.stdout is not None:
            process.stdout.close()


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "microbatch", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def bench_json(*args: str) -> dict[str, Any]:
    done = bench(*args, "--json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def check_run(run: dict[str, Any]) -> None:
    """The numbers of one run are consistent with each other."""
    assert run["requests"] > 0
    assert run["ok"] + sum(run["errors"].values()) == run["requests"]
    assert run["replies"] <= run["requests"]
    assert run["elapsed_s"] > 0
    assert run["req_per_s"] == pytest.approx(run["replies"] / run["elapsed_s"])
    latency = run["latency_ms"]
    assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
    assert run["client_cpu"] >= 0


def test_closed_and_open_loop_against_a_two_stage_service(url: str, tmp_path: Path) -> None:
    png = tmp_path / "bench.png"
    report = bench_json(
        url, "-c", "1,8", "--rate", "100", "-d", "1", "--warmup", "0.2", "--plot", str(png)
    )
    assert report["url"] == url + "/predict"
    assert report["bodies"] == "1 example(s) from /openapi.json"  # the service's examples
    runs = report["runs"]
    assert [(r["mode"], r["concurrency"], r["rate"]) for r in runs] == [
        ("closed", 1, None),
        ("closed", 8, None),
        ("open", None, 100.0),
    ]
    for run in runs:
        check_run(run)
        assert run["errors"] == {}
        assert set(run["mean_batch_size"]) == {"Scale", "Shift"}
        assert all(size >= 1 for size in run["mean_batch_size"].values())
        assert run["unsent"] == 0
    assert png.read_bytes().startswith(b"\x89PNG")


def test_bodies_from_a_file_and_the_table(url: str, tmp_path: Path) -> None:
    bodies = tmp_path / "bodies.jsonl"
    bodies.write_text('{"x": 1.5}\n{"x": 2.5}\n')
    done = bench(url, "-c", "2", "-d", "0.5", "--warmup", "0", "--body-file", str(bodies))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"microbatch bench {url}/predict"
    assert "2 bodies from" in lines[1]
    header = lines[4].split()
    assert header[:5] == ["run", "requests", "req/s", "p50", "ms"]
    assert lines[5].startswith("c=2 ")
    assert "warning" not in done.stdout
    assert "\r" not in done.stderr  # no progress bar without a terminal


def test_errors_are_counted_by_status(url: str) -> None:
    missing = bench_json(url + "/nowhere", "--body", '{"x": 1}', "-c", "2", "-d", "0.5")
    invalid = bench_json(url, "--body", '{"x": "not a number"}', "-c", "2", "-d", "0.5")
    for report, status in ((missing, "404"), (invalid, "422")):
        [run] = report["runs"]
        check_run(run)
        assert run["ok"] == 0
        assert run["errors"] == {status: run["requests"]}
        assert any("no request succeeded" in warning for warning in report["warnings"])


def test_what_cannot_run_exits_non_zero_with_the_reason(url: str, tmp_path: Path) -> None:
    port = url.rsplit(":", 1)[1]
    unreachable = bench("http://127.0.0.1:1", "-c", "1", "-d", "0.1")
    assert unreachable.returncode == 1
    assert "cannot talk to http://127.0.0.1:1" in unreachable.stderr
    assert bench(f"https://127.0.0.1:{port}", "-d", "0.1").returncode == 2
    assert bench(url, "-c", "0", "-d", "0.1").returncode == 2
    no_bodies = bench(url + "/nowhere", "-c", "1", "-d", "0.1")
    assert no_bodies.returncode == 1
    assert "pass --body-file" in no_bodies.stderr
