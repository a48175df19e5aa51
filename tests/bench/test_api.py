"""``microbatch.bench``'s public names are pinned and documented; the progress bar draws."""

from __future__ import annotations

import asyncio
import io

import microbatch.bench
from microbatch.bench import Tally
from microbatch.bench.progress import Progress

PUBLIC = {
    "BenchPlan",
    "BenchReport",
    "Bodies",
    "BodyError",
    "Connection",
    "ConnectionClosed",
    "Endpoint",
    "PlotUnavailable",
    "ProtocolError",
    "RequestTimeout",
    "Response",
    "ResponseParser",
    "RunResult",
    "Tally",
    "bodies_from_service",
    "closed_loop",
    "mean_batch_sizes",
    "open_loop",
    "parse_batch_totals",
    "parse_body",
    "percentile",
    "plot",
    "read_body_file",
    "run_bench",
    "sample",
    "to_json",
    "to_text",
}


def test_all_is_pinned_and_documented() -> None:
    assert set(microbatch.bench.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(microbatch.bench, name).__doc__, f"{name} has no docstring"


async def test_the_progress_bar_draws_in_place_and_clears_its_line() -> None:
    stream = io.StringIO()
    tally = Tally()
    tally.reply(200, 0.001)
    tally.fail("timeout")
    async with Progress(stream, enabled=True).showing("c=4", 10.0, tally):
        await asyncio.sleep(0)  # let the first redraw run
        await asyncio.sleep(0)
    text = stream.getvalue()
    assert text.startswith("\r\x1b[2Kc=4 [")
    assert "2 req" in text and "1 err" in text
    assert text.endswith("\r\x1b[2K")


async def test_a_disabled_progress_bar_writes_nothing() -> None:
    stream = io.StringIO()
    async with Progress(stream, enabled=False).showing("c=4", 1.0, Tally()):
        await asyncio.sleep(0)
    assert stream.getvalue() == ""
