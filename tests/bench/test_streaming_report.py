"""The streaming benchmark's summary (``benchmarks/stream_report.py``) gives the time
to first chunk p99 of every stream, and apart that of the streams opened after the
start (a client's first stream opens together with every other client's first)."""

from __future__ import annotations

from tests.bench.benchmark_modules import load_benchmark

stream_report = load_benchmark("stream_report")


def test_the_streams_opened_at_the_start_count_apart() -> None:
    at_start = [(8, 0.010, 0.020, True)] * 4  # four clients' first streams: slow
    later = [(8, 0.002 + k / 1000, 0.012, False) for k in range(8)]
    figures = stream_report.summarise([*at_start, *later], wall=1.0)
    assert figures["streams"] == 12 and figures["chunks"] == 96
    assert round(figures["ttfc_p99_ms"], 6) == 10.0  # every stream: the start's
    assert round(figures["ttfc_p99_after_start_ms"], 6) == 9.0  # the later ones' slowest


def test_the_target_line_gives_both() -> None:
    figures = stream_report.summarise([(8, 0.010, 0.020, True), (8, 0.004, 0.012, False)], wall=1.0)
    lines = stream_report.targets({"ours @ 2": {**figures, "stepwise": True}}, "ours", 2, 2.0)
    assert any(
        "TTFC p99 = **5.0 step times** (target ≤ 5: met)" in line
        and "without each client's first stream (all 2 opened at once): 2.0 step times" in line
        for line in lines
    )


def test_each_repeat_ratio_is_listed_with_the_median() -> None:
    results = {
        "ours @ 64": {"ratios": [2.36, 1.94, 2.12]},
        "lockstep @ 64": {"chunks_per_s": 1.0},
    }
    (line, blank) = stream_report.repeats(results, "ours")
    assert line == (
        "- ours @ 64: step-wise ÷ lockstep in each repeat: 2.36, 1.94, 2.12"
        " (median 2.12x, 2 of 3 ≥ 2x)"
    )
    assert blank == ""
    assert stream_report.repeats({"ours @ 64": {"chunks_per_s": 1.0}}, "ours") == []


def test_the_median_run_is_the_middle_by_chunks_per_second() -> None:
    runs = [{"chunks_per_s": rate, "run": k} for k, rate in enumerate([30.0, 10.0, 20.0, 40.0])]
    assert stream_report.median_run(runs) == {"chunks_per_s": 20.0, "run": 2}
    assert stream_report.median_run(runs[:3]) == {"chunks_per_s": 20.0, "run": 2}


def test_openai_contenders_are_compared_with_each_other_only() -> None:
    def figures(rate: float, stepwise: bool) -> dict[str, object]:
        made = stream_report.summarise([(8, 0.004, 0.012, False)], wall=8 / rate)
        return {**made, "stepwise": stepwise}

    http = {
        "microbatch step-wise (HTTP, NDJSON) @ 64": figures(300.0, True),
        "MOSEC SSE @ 64": figures(100.0, False),
        "microbatch step-wise (OpenAI chat SSE) @ 64": figures(200.0, True),
        "LitServe OpenAISpec + batching (OpenAI chat SSE) @ 64": figures(50.0, False),
    }
    text = stream_report.report({}, {}, http, {}, [64])
    plain = text.split("microbatch step-wise (HTTP, NDJSON) at 64 streams")[1]
    plain, openai = plain.split("microbatch step-wise (OpenAI chat SSE) at 64 streams")
    openai = openai.split("Versions")[0]
    assert "chunks/s ÷ MOSEC SSE: **3.00x**" in plain and "OpenAI" not in plain
    assert "chunks/s ÷ LitServe OpenAISpec + batching (OpenAI chat SSE): **4.00x**" in openai
    assert "MOSEC" not in openai and "NDJSON" not in openai


def test_the_generative_example_has_a_section_per_place_its_model_ran() -> None:
    def figures(rate: float, stepwise: bool, step_ms: float) -> dict[str, object]:
        made = stream_report.summarise([(8, 0.004, 0.012, False)], wall=8 / rate)
        return {**made, "stepwise": stepwise, "mean_step_ms": step_ms}

    generative = {
        "process": {
            "generate.py step-wise @ 64": figures(250.0, True, 1.0),
            "generate.py lockstep @ 64": figures(100.0, False, 0.5),
        },
        "thread": {
            "generate.py step-wise @ 64": figures(180.0, True, 2.0),
            "generate.py lockstep @ 64": figures(100.0, False, 0.5),
        },
    }
    text = stream_report.report({}, generative, {}, {}, [64])
    _, process, thread = text.split("## The generative example")
    assert "a worker process, as `examples.generate` serves it" in process
    assert "chunks/s ÷ generate.py lockstep: **2.50x** (target ≥ 2x: met)" in process
    assert "TTFC p99 = **4.0 step times** (target ≤ 5: met)" in process
    assert "a thread of the serving process" in thread
    assert "chunks/s ÷ generate.py lockstep: **1.80x** (target ≥ 2x: missed)" in thread
    assert "TTFC p99 = **2.0 step times**" in thread


def test_the_report_says_which_build_of_microbatch_ran_in_process() -> None:
    import microbatch.stepping

    text = stream_report.report({}, {}, {}, {}, [64])
    compiled = microbatch.stepping.__file__.endswith(".so")
    assert f"In-process contenders: microbatch {stream_report.microbatch_build()}." in text
    assert stream_report.microbatch_build().startswith("compiled") == compiled
