"""HTTP/1.1 response heads, written once per response, and the server's fixed replies."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus

__all__ = [
    "BAD_REQUEST",
    "CONTINUE",
    "HEADERS_TOO_LARGE",
    "REQUEST_TIMEOUT",
    "SERVICE_UNAVAILABLE",
    "Refusal",
    "date_line",
    "head",
    "ok_head",
    "status_line",
    "stream_head",
]

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


_STATUS_LINES: dict[int, bytes] = {}


def status_line(status: int) -> bytes:
    """``HTTP/1.1 200 OK\\r\\n`` for a status code (any code from 100 to 999)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = HTTPStatus(status).phrase.encode()
        except ValueError:
            phrase = b""
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, phrase)
    return line


@dataclass(frozen=True, slots=True)
class Refusal:
    """A reply of the connection layer itself, after which the connection closes.

    Attributes:
        status: The status code.
        error: The error's name, as ``Server-Timing`` tells it.
        message: The plain-text body.
    """

    status: int
    error: str
    message: bytes

    def reply(self, timing_line: bytes = b"") -> bytes:
        """The whole response, with ``timing_line`` (a ``server-timing`` header line,
        or empty) in its head."""
        return status_line(self.status) + (
            b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n%s"
            b"connection: close\r\n\r\n%s" % (len(self.message), timing_line, self.message)
        )


BAD_REQUEST = Refusal(400, "BadRequest", b"malformed HTTP request")
REQUEST_TIMEOUT = Refusal(408, "RequestTimeout", b"the request was not received in time")
HEADERS_TOO_LARGE = Refusal(431, "HeadersTooLarge", b"the request's headers are too large")
SERVICE_UNAVAILABLE = Refusal(503, "TooManyConnections", b"too many connections")


class _DateHeader:
    """The ``date`` header line, made again at most once a second."""

    __slots__ = ("_line", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._line


_date = _DateHeader()


def head(
    status: int,
    media_type: bytes,
    length: int,
    extra: Iterable[tuple[bytes, bytes]] = (),
    connection: bytes = b"",
) -> bytes:
    """A whole response head with ``content-length``.

    Args:
        status: The status code.
        media_type: The ``content-type`` value.
        length: The body's length in bytes.
        extra: More header lines.
        connection: A ``connection`` line (e.g. ``b"connection: close\\r\\n"``), or empty.
    """
    lines = b"".join(b"%s: %s\r\n" % pair for pair in extra)
    return b"%scontent-type: %s\r\ncontent-length: %d\r\n%s%s%s\r\n" % (
        status_line(status),
        media_type,
        length,
        _date.line(),
        lines,
        connection,
    )


_OK_PREFIXES: dict[bytes, bytes] = {}


def ok_head(media_type: bytes, length: int, connection: bytes = b"") -> bytes:
    """The head of a ``200 OK`` with a body of ``length`` bytes: :func:`head` for the
    hot path (its fixed part made once per media type)."""
    prefix = _OK_PREFIXES.get(media_type)
    if prefix is None:
        prefix = _OK_PREFIXES[media_type] = (
            status_line(200) + b"content-type: " + media_type + b"\r\ncontent-length: "
        )
    return b"%s%d\r\n%s%s\r\n" % (prefix, length, _date.line(), connection)


_STREAM_PREFIXES: dict[tuple[bytes, bool], bytes] = {}


def stream_head(media_type: bytes, chunked: bool, lines: bytes = b"") -> bytes:
    """The head of a ``200 OK`` stream: no length, chunked (HTTP/1.1) or running to
    the close (HTTP/1.0), uncached, and not held back by proxies.

    Args:
        media_type: The ``content-type`` value.
        chunked: Frame the body with ``transfer-encoding: chunked``.
        lines: More header lines, each ending in CRLF.
    """
    prefix = _STREAM_PREFIXES.get((media_type, chunked))
    if prefix is None:
        prefix = _STREAM_PREFIXES[(media_type, chunked)] = (
            status_line(200)
            + b"content-type: "
            + media_type
            + b"\r\ncache-control: no-cache\r\nx-accel-buffering: no\r\n"
            + (b"transfer-encoding: chunked\r\n" if chunked else b"")
        )
    return b"%s%s%s\r\n" % (prefix, _date.line(), lines)


def date_line() -> bytes:
    """The current ``date`` header line."""
    return _date.line()
