"""Whether a step call hands the GIL to the model's thread: the way in use stays
until a probe of the other way is answered sooner by at least the margin; probes
come after 16, 32, ... up to 1024 calls, and again after 16 once the way changed."""

from __future__ import annotations

from microbatch.pipeline.gil_handoff import (
    FIRST_PROBE,
    LAST_PROBE,
    MARGIN,
    PROBE_CALLS,
    GilHandoff,
)


def _calls_until_probe(handoff: GilHandoff, seconds: float) -> int:
    """Calls the way in use (each answered after ``seconds``) until the chooser
    asks for the other way; that first probe call is not answered yet."""
    used = handoff.handing
    for count in range(1, 10 * LAST_PROBE):
        way = handoff.choose()
        if way != used:
            return count
        handoff.observe(way, seconds)
    raise AssertionError("no probe")


def _finish_probe(handoff: GilHandoff, seconds: float) -> None:
    """Answer the probe's calls (the first was chosen already) after ``seconds``."""
    way = not handoff.handing
    handoff.observe(way, seconds)
    for _ in range(PROBE_CALLS - 1):
        assert handoff.choose() == way
        handoff.observe(way, seconds)


def test_it_starts_without_a_handover_and_probes_after_the_first_gap() -> None:
    handoff = GilHandoff()
    assert handoff.handing is False
    assert _calls_until_probe(handoff, 1e-3) == FIRST_PROBE


def test_a_probe_answered_sooner_by_more_than_the_margin_switches_the_way() -> None:
    handoff = GilHandoff()
    _calls_until_probe(handoff, 1e-3)
    _finish_probe(handoff, 1e-3 * (1 - 2 * MARGIN))
    assert handoff.handing is True
    # A switch is checked again soon: the old way is probed after the first gap.
    assert _calls_until_probe(handoff, 1e-3) == FIRST_PROBE


def test_a_probe_within_the_margin_keeps_the_way_and_the_gaps_double_to_the_last() -> None:
    handoff = GilHandoff()
    gaps = []
    for _ in range(9):
        gaps.append(_calls_until_probe(handoff, 1e-3))
        _finish_probe(handoff, 1e-3 * (1 - MARGIN / 2))
        assert handoff.handing is False
    assert gaps == [16, 32, 64, 128, 256, 512, LAST_PROBE, LAST_PROBE, LAST_PROBE]


def test_a_wrong_switch_is_undone_at_the_next_probe() -> None:
    handoff = GilHandoff()
    _calls_until_probe(handoff, 1e-3)
    _finish_probe(handoff, 0.5e-3)  # the probe was lucky
    assert handoff.handing is True
    _calls_until_probe(handoff, 2e-3)  # handed over, calls take longer
    _finish_probe(handoff, 1e-3)
    assert handoff.handing is False


def test_no_probe_before_the_way_in_use_was_timed_once() -> None:
    handoff = GilHandoff()
    for _ in range(3 * FIRST_PROBE):  # chosen, never answered (nothing to compare)
        assert handoff.choose() is False
    handoff.observe(False, 1e-3)
    assert handoff.choose() is True  # the probe that was due
