"""How ``Server-Timing`` numbers are written: milliseconds with two decimals (one
rule for every duration), and a batch's shared metrics rendered once per batch
while each response's line stays its own."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from microbatch._batch_timing import record_batch
from microbatch.timing import Timing, batch_parts, milliseconds


@given(st.floats(min_value=0.0, max_value=1e4, allow_nan=False))
@settings(max_examples=300, deadline=None)
def test_milliseconds_are_the_duration_to_a_hundredth(seconds: float) -> None:
    text = milliseconds(seconds)
    whole, _, cents = text.partition(b".")
    assert whole.isdigit() and len(cents) == 2 and cents.isdigit()
    assert abs(float(text) - seconds * 1e3) <= 0.005 + 1e-9 * seconds * 1e3
    assert milliseconds(seconds) == text  # and the same again (kept, or rendered anew)


def test_milliseconds_round_half_up_and_write_a_negative_as_such() -> None:
    assert milliseconds(0.0) == b"0.00"
    assert milliseconds(0.001) == b"1.00"
    assert milliseconds(0.0000049) == b"0.00" and milliseconds(0.0000051) == b"0.01"
    assert milliseconds(12.3456) == b"12345.60"
    assert milliseconds(-0.0012) == b"-1.20"


def test_a_batch_renders_its_shared_part_once_and_each_line_its_own_numbers() -> None:
    first, second, silent = Timing(10.0), Timing(10.0005), Timing(10.0, told=False)
    first.stage = second.stage = silent.stage = "embed"
    record_batch(
        "ignored",
        [(first, 10.0), (second, 10.0005), (silent, 10.0)],
        10.002,
        10.003,
        10.007,
        3,
        None,
    )
    assert first.rendered is second.rendered  # one rendering for the batch
    assert first.rendered == batch_parts("embed", 0.001, 0.004, 3, None)
    assert silent.rendered is None and silent.header_line(10.008) == b""
    assert first.header_line(10.008) == (
        b"server-timing: embed.queue;dur=2.00, embed.behind;dur=1.00, "
        b'embed.model;dur=4.00, embed.batch;desc="size=3", total;dur=8.00\r\n'
    )
    assert second.header_line(10.008) == (
        b"server-timing: embed.queue;dur=1.50, embed.behind;dur=1.00, "
        b'embed.model;dur=4.00, embed.batch;desc="size=3", total;dur=7.50\r\n'
    )
    # the shared rendering is the one the record alone would give
    assert first.header_line(10.008) == b"server-timing: " + first.header_value(10.008) + b"\r\n"


def test_a_record_appended_by_hand_is_rendered_from_its_entries() -> None:
    timing = Timing(0.0)
    record_batch("embed", [(timing, 0.0)], 0.001, 0.001, 0.002, 1, 5.0)
    timing.record("rerank", 0.0, 0.0, 0.003, 2)  # a second stage: the shared part no longer fits
    assert timing.rendered is None
    line = timing.header_line(0.006)
    assert b'embed.batch;desc="size=1 cost=5"' in line
    assert b"rerank.model;dur=3.00" in line and line.endswith(b"total;dur=6.00\r\n")
