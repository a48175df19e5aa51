"""The header readers every body route shares: ``Content-Length`` read as ``int()``
reads it (digits alone on a path of their own), and its limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from microbatch.http.predict import check_body_length, content_length
from microbatch.http.status import BadRequest, BodyTooLarge


@given(st.integers(0, 10**25))
def test_a_number_is_read_as_int_reads_it(size: int) -> None:
    assert content_length(str(size).encode()) == size


@given(st.binary(max_size=24))
def test_any_value_is_read_as_int_reads_it_or_is_minus_one(value: bytes) -> None:
    try:
        expected = int(value)
    except ValueError:
        expected = -1
    assert content_length(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(b"10", 10), (b"007", 7), (b" 12 ", 12), (b"", -1), (b"1e3", -1), (b"\xd9\xa3", -1)],
)
def test_examples(value: bytes, expected: int) -> None:
    assert content_length(value) == expected


def test_the_limit_and_a_value_that_is_no_number() -> None:
    check_body_length(None, 10)
    check_body_length(b"10", 10)
    with pytest.raises(BodyTooLarge, match="11 bytes; the limit is 10"):
        check_body_length(b"11", 10)
    with pytest.raises(BadRequest, match="not a number"):
        check_body_length(b"ten", 10)
    with pytest.raises(BadRequest, match="not a number"):
        check_body_length(b"-5", 10)
