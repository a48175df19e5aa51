"""Text cut before its first stop sequence, piece by piece (``http/stop_text.py``)."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from microbatch.http.stop_text import StopText


def _sent(pieces: list[str], stops: list[str]) -> list[str]:
    text = StopText(stops)
    sent = [text.feed(piece) for piece in pieces]
    return [*sent, text.flush()]


def test_text_without_stops_goes_through_as_it_comes() -> None:
    assert _sent(["Hel", "lo"], []) == ["Hel", "lo", ""]


def test_a_stop_inside_a_piece_ends_the_text_before_it() -> None:
    text = StopText(["\n"])
    assert text.feed("one\ntwo") == "one"
    assert text.stopped
    assert text.feed("three") == ""
    assert text.flush() == ""


def test_a_stop_split_across_pieces_is_held_back_until_it_is_known() -> None:
    assert _sent(["He", "l", "lo wor", "ld"], ["llo w"]) == ["He", "", "", "", ""]


def test_what_only_looked_like_a_stop_goes_out_once_it_is_not_one() -> None:
    assert _sent(["ab", "ac"], ["abd"]) == ["", "abac", ""]
    assert _sent(["xa"], ["ab"]) == ["x", "a"]  # the text ended: the held "a" goes out


def test_the_earliest_of_several_stops_wins() -> None:
    assert _sent(["zab"], ["b", "ab"]) == ["z", ""]
    assert _sent(["za", "b"], ["b", "zab"]) == ["", "", ""]


def test_the_stop_complete_first_wins_whatever_the_cuts() -> None:
    # "a" is complete before "\naa" is, in one piece or two
    assert _sent(["\naa"], ["a", "\naa"]) == ["\n", ""]
    assert _sent(["\na", "a"], ["a", "\naa"]) == ["\n", "", ""]


def _first_stop(text: str, stops: list[str]) -> str:
    """``text`` before the stop complete first (the earliest end, then the longest)."""
    found = [(at + len(stop), at) for stop in stops if (at := text.find(stop)) >= 0]
    return text[: min(found)[1]] if found else text


@given(
    text=st.text(alphabet="ab\n", max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=12),
    stops=st.lists(st.text(alphabet="ab\n", min_size=1, max_size=5), max_size=4),
)
def test_the_text_sent_is_the_text_up_to_the_first_stop_however_it_is_cut(
    text: str, cuts: list[int], stops: list[str]
) -> None:
    bounds = [0, *sorted(min(cut, len(text)) for cut in cuts), len(text)]
    pieces = [text[start:end] for start, end in pairwise(bounds)]
    want = _first_stop(text, stops)
    scan = StopText(stops)
    sent = ""
    for piece in pieces:
        sent += scan.feed(piece)
        assert want.startswith(sent)  # nothing at or after the first stop, ever
    sent += scan.flush()
    assert sent == want
    assert scan.stopped == any(stop in text for stop in stops)
