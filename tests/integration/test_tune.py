"""``microbatch tune`` end to end against a small in-repo service: structure and
sanity of what it reports, never its speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from microbatch.cli import main

ROOT = Path(__file__).resolve().parent.parent.parent
TARGET = "tests.integration.tune_service:service"


def test_tune_prints_json_advice_per_stage_and_draws_the_plot(tmp_path: Path) -> None:
    png = tmp_path / "tune.png"
    options = ["--max-batch", "16", "--repeats", "2", "--p99-ms", "1000", "--json", "--plot"]
    done = subprocess.run(
        [sys.executable, "-m", "microbatch", "tune", TARGET, *options, str(png)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["target"] == TARGET and report["p99_ms"] == 1000
    assert [s["name"] for s in report["stages"]] == ["Vectorize", "Project"]
    assert [s["workers"] for s in report["stages"]] == [2, 1]
    for stage in report["stages"]:
        sizes = [m["batch_size"] for m in stage["measurements"]]
        assert sizes == [1, 2, 4, 8, 16]
        assert all(m["ms"] > 0 and m["items_per_s"] > 0 for m in stage["measurements"])
        advised = stage["recommended"]
        assert advised["max_batch_size"] in sizes
        assert 0 < advised["max_latency_ms"] <= 1000
        assert stage["knee"] in sizes and stage["memory_limit"] is None
        assert stage["expected"]["worst_latency_ms"] == pytest.approx(
            2 * stage["expected"]["batch_ms"]
        )
    # A tiny model outruns the serving path: the estimate is capped by it.
    assert report["bottleneck"] in ("Vectorize", "Project", "serving path")
    assert 0 < report["items_per_s"] <= report["serving_items_per_s"]
    assert sum(s["recommended"]["max_latency_ms"] for s in report["stages"]) == pytest.approx(
        1000, abs=0.01
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "stage Project: timing batches of 1, 2, 4, 8, 16" in done.stderr


def test_tune_prints_a_table_with_the_advice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", TARGET, "--max-batch", "4", "--repeats", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "stage Vectorize (2 workers)" in out and "stage Project (1 worker)" in out
    assert out.count("advised: BatchConfig(max_batch_size=") == 2
    assert "<- advised" in out and "pipeline: ~" in out


def test_tune_says_clearly_when_matplotlib_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    args = ["tune", TARGET, "--max-batch", "2", "--repeats", "1", "--plot", str(tmp_path / "p.png")]
    assert main(args) == 1
    assert "--plot needs matplotlib: pip install matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("tests.integration.tune_service", "expected MODULE:ATTR"),
        ("tests.integration.no_such_module:service", "cannot import"),
        ("tests.integration.tune_service:not_a_service", "not a microbatch.Service"),
        ("tests.integration.tune_service:no_examples", "no warm-up examples"),
    ],
)
def test_tune_explains_a_target_it_cannot_measure(
    target: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", target]) == 1
    assert message in capsys.readouterr().err
