"""The connection reads a request's HTTP version from its header block's first line
(``says_http10``), not from the parser's formatted string: the two must agree on every
head the parser accepts."""

from __future__ import annotations

import httptools
import pytest
from hypothesis import given
from hypothesis import strategies as st

from microbatch.serve.request_line import says_http10


class _Versions:
    """Parser callbacks that keep the version the parser read."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.version: str | None = None

    def on_headers_complete(self) -> None:
        self.version = self.parser.get_http_version()


def _parsed_version(head: bytes) -> str | None:
    """The parser's version of ``head``, or None where it refuses the head."""
    versions = _Versions()
    try:
        versions.parser.feed_data(head)
    except httptools.HttpParserError:
        return None
    return versions.version


_TARGETS = st.text("abcdefghijklmnopqrstuvwxyz0123456789/-_.?=&%", min_size=1, max_size=20)
_VERSIONS = st.sampled_from([b"1.0", b"1.1", b"0.9", b"2.0", b"1.01", b"10", b"1.0 ", b""])


@given(
    st.integers(0, 3),
    st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"OPTIONS"]),
    _TARGETS,
    _VERSIONS,
    st.lists(st.sampled_from([b"Host: a", b"Connection: keep-alive", b"X: HTTP/1.0"]), max_size=3),
)
def test_the_version_read_from_the_line_is_the_parsers(
    blank_lines: int, method: bytes, target: str, version: bytes, headers: list[bytes]
) -> None:
    line = method + b" /" + target.encode() + b" HTTP/" + version
    head = b"\r\n" * blank_lines + b"\r\n".join([line, *headers]) + b"\r\n\r\n"
    parsed = _parsed_version(head)
    if parsed is not None:
        assert says_http10(head) == (parsed == "1.0")


@pytest.mark.parametrize(
    ("head", "http10"),
    [
        (b"GET / HTTP/1.0\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nX: HTTP/1.0\r\n\r\n", False),
        (b"\r\n\r\nPOST /p HTTP/1.0\r\nHost: a\r\n\r\n", True),
        (b"GET /HTTP/1.0 HTTP/1.1\r\n\r\n", False),
        (b"", False),
    ],
)
def test_known_heads(head: bytes, http10: bool) -> None:
    assert says_http10(head) is http10
