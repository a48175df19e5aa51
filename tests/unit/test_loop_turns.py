"""Whether a turn of the event loop after streams ended is worth taking
(``Comebacks``): on while the callers come back in it, off once they do not, with
probes that grow rarer while nobody comes back and turn it on again when they do."""

from __future__ import annotations

from microbatch._loop_turns import Comebacks


def _chances_until_taken(comebacks: Comebacks) -> int:
    for chance in range(1, 5000):
        if comebacks.worth_a_turn():
            return chance
    raise AssertionError("never taken")


def test_turns_are_taken_while_the_callers_come_back_in_them() -> None:
    comebacks = Comebacks()
    for _ in range(50):
        assert comebacks.worth_a_turn()
        comebacks.turned(new=2, ended=2)


def test_turns_stop_when_nobody_comes_back_and_probes_grow_rarer() -> None:
    comebacks = Comebacks()
    taken = 0
    while comebacks.worth_a_turn():
        comebacks.turned(new=0, ended=1)
        taken += 1
    assert 1 <= taken <= 4  # a few turns find out
    gaps = []
    for _ in range(8):
        gaps.append(_chances_until_taken(comebacks))
        comebacks.turned(new=0, ended=3)
    # 16 chances before the first probe (the loop above declined the first), then
    # twice as many after each probe that found nobody back, up to 1024.
    assert gaps == [15, 32, 64, 128, 256, 512, 1024, 1024]


def test_a_probe_that_finds_callers_back_turns_them_on_again() -> None:
    comebacks = Comebacks()
    while comebacks.worth_a_turn():
        comebacks.turned(new=0, ended=1)
    for _ in range(3):
        _chances_until_taken(comebacks)
        comebacks.turned(new=0, ended=1)
    for _ in range(4):  # callers come back in the probes: a few bring it back on
        _chances_until_taken(comebacks)
        comebacks.turned(new=1, ended=1)
    assert all(comebacks.worth_a_turn() for _ in range(10))


def test_more_new_items_than_ended_streams_count_as_all_back() -> None:
    comebacks = Comebacks()
    comebacks.turned(new=9, ended=1)
    assert comebacks.share == 1.0


def test_fewer_waiting_after_the_turn_counts_as_none_back() -> None:
    comebacks = Comebacks()
    comebacks.turned(new=-3, ended=1)  # the loop closed meanwhile: its queue emptied
    assert comebacks.share == 0.75
