"""An incremental parser of HTTP/1.1 responses: bytes in, complete responses out.

Pure (no I/O), so the load generator's client stays small and the framing rules
(``Content-Length``, chunked transfer coding, a body that ends when the connection
closes, interim 1xx responses) are tested on their own, split at every byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ProtocolError", "Response", "ResponseParser"]

_HEX = re.compile(rb"[0-9A-Fa-f]+")
_NO_BODY = (204, 304)


class ProtocolError(Exception):
    """The peer sent bytes that are not a well-formed HTTP/1.x response."""


@dataclass(frozen=True)
class Response:
    """One complete response.

    Attributes:
        status: The status code.
        headers: Header names lower-cased; a repeated name's values joined by ``", "``.
        body: The body, de-chunked.
        keep_alive: The connection may carry another request after this one.
    """

    status: int
    headers: dict[bytes, bytes]
    body: bytes
    keep_alive: bool


@dataclass
class _Head:
    status: int
    headers: dict[bytes, bytes]
    keep_alive: bool
    length: int | None  # None: chunked or until close
    chunked: bool


class ResponseParser:
    """Feed it what the socket gave; it returns every response completed so far.

    Args:
        max_head_bytes: Longest status line plus headers accepted.

    Raises:
        ProtocolError: From :meth:`feed` or :meth:`feed_eof` on malformed input; the
            connection must then be closed.
    """

    def __init__(self, max_head_bytes: int = 65536) -> None:
        self._buffer = bytearray()
        self._max_head_bytes = max_head_bytes
        self._head: _Head | None = None
        self._chunks: list[bytes] = []
        self._in_trailer = False

    @property
    def idle(self) -> bool:
        """No partial response is buffered."""
        return self._head is None and not self._buffer

    def feed(self, data: bytes) -> list[Response]:
        """Add received bytes; return the responses they complete, in order."""
        self._buffer += data
        done: list[Response] = []
        while True:
            if self._head is None:
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buffer) > self._max_head_bytes:
                        raise ProtocolError("response head too long")
                    return done
                if end > self._max_head_bytes:
                    raise ProtocolError("response head too long")
                head = _parse_head(bytes(self._buffer[:end]))
                del self._buffer[: end + 4]
                if 100 <= head.status < 200:
                    continue  # interim response: the real one follows
                self._head = head
            response = self._body(self._head)
            if response is None:
                return done
            done.append(response)
            self._head = None

    def feed_eof(self) -> Response | None:
        """The peer closed: the response whose body runs to the close, if one is open.

        Raises:
            ProtocolError: A response was cut short.
        """
        head = self._head
        if head is None:
            if self._buffer:
                raise ProtocolError("connection closed inside a response head")
            return None
        if head.length is not None or head.chunked:
            raise ProtocolError("connection closed before the body was complete")
        body = bytes(self._buffer)
        self._buffer.clear()
        self._head = None
        return Response(head.status, head.headers, body, keep_alive=False)

    def _body(self, head: _Head) -> Response | None:
        if head.chunked:
            return self._chunked(head)
        if head.length is None:
            return None  # until the connection closes (feed_eof)
        if len(self._buffer) < head.length:
            return None
        body = bytes(self._buffer[: head.length])
        del self._buffer[: head.length]
        return Response(head.status, head.headers, body, head.keep_alive)

    def _chunked(self, head: _Head) -> Response | None:
        buffer = self._buffer
        while True:
            end = buffer.find(b"\r\n")
            if end < 0:
                if len(buffer) > self._max_head_bytes:
                    raise ProtocolError("chunk size line or trailer too long")
                return None
            if self._in_trailer:
                line_empty = end == 0
                del buffer[: end + 2]
                if line_empty:
                    body = b"".join(self._chunks)
                    self._chunks.clear()
                    self._in_trailer = False
                    return Response(head.status, head.headers, body, head.keep_alive)
                continue
            size_text = bytes(buffer[:end]).split(b";", 1)[0].strip()
            if not _HEX.fullmatch(size_text):
                raise ProtocolError(f"bad chunk size {size_text!r}")
            size = int(size_text, 16)
            if size == 0:
                del buffer[: end + 2]
                self._in_trailer = True
                continue
            start, stop = end + 2, end + 2 + size
            if len(buffer) < stop + 2:
                return None
            if buffer[stop : stop + 2] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            self._chunks.append(bytes(buffer[start:stop]))
            del buffer[: stop + 2]


def _parse_head(head: bytes) -> _Head:
    lines = head.split(b"\r\n")
    status_line = lines[0]
    version, _, rest = status_line.partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"bad status line {status_line[:80]!r}")
    status = int(code)
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        name = name.strip().lower()
        if not colon or not name:
            raise ProtocolError(f"bad header line {line[:80]!r}")
        value = value.strip()
        headers[name] = headers[name] + b", " + value if name in headers else value
    connection = headers.get(b"connection", b"").lower()
    if version == b"HTTP/1.0":
        keep_alive = b"keep-alive" in connection
    else:
        keep_alive = b"close" not in connection
    chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
    length: int | None = None
    if status in _NO_BODY:
        length, chunked = 0, False
    elif not chunked and b"content-length" in headers:
        length = _content_length(headers[b"content-length"])
    if length is None and not chunked:
        keep_alive = False  # the body runs until the peer closes
    return _Head(status, headers, keep_alive, length, chunked)


def _content_length(value: bytes) -> int:
    values = {part.strip() for part in value.split(b",")}
    if len(values) != 1:
        raise ProtocolError(f"conflicting Content-Length {value!r}")
    text = values.pop()
    if not text.isdigit():
        raise ProtocolError(f"bad Content-Length {value!r}")
    return int(text)
