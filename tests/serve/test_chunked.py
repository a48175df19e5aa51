"""Finding the end of a chunked body, however it is split (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from microbatch.serve.chunked import MALFORMED, TOO_LONG, ChunkedEnd


def chunked(parts: list[bytes], trailers: list[bytes]) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts if part)
    return body + b"0\r\n" + b"".join(line + b"\r\n" for line in trailers) + b"\r\n"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=40), max_size=5),
    st.lists(st.just(b"x-sum: 12"), max_size=2),
    st.binary(max_size=30),
    st.lists(st.integers(0, 400), max_size=6),
)
def test_the_end_is_found_at_any_split(
    parts: list[bytes], trailers: list[bytes], after: bytes, cuts: list[int]
) -> None:
    body = chunked(parts, trailers)
    data = body + after
    scanner = ChunkedEnd(1024)
    start, found = 0, None
    for cut in [*sorted(c for c in cuts if c < len(data)), len(data)]:
        if cut <= start:
            continue
        end = scanner.scan(data[start:cut])
        if end >= 0:
            found = start + end
            break
        assert end == -1
        start = cut
    assert found == len(body)


def test_bad_framing_is_reported() -> None:
    assert ChunkedEnd(1024).scan(b"zz\r\n") == MALFORMED
    assert ChunkedEnd(8).scan(b"1" * 20) == TOO_LONG
    assert ChunkedEnd(8).scan(b"0\r\n" + b"x-long: " + b"y" * 20 + b"\r\n") == TOO_LONG
