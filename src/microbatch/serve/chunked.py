"""Where a chunked request body ends, found without decoding it.

The parser (httptools) decodes chunked bodies, but it reads on past a body's end
into whatever follows: a pipelined request would then start inside a feed, where
its header cap could not be kept. :class:`ChunkedEnd` follows the framing (size
lines, data, trailers) so that the connection feeds the parser exactly to the end
of the body, as it does for a ``Content-Length`` body. It only finds the end; the
parser still checks every byte.
"""

from __future__ import annotations

__all__ = ["MALFORMED", "TOO_LONG", "ChunkedEnd"]

MALFORMED = -2
"""What :meth:`ChunkedEnd.scan` returns when a size line is not hexadecimal."""

TOO_LONG = -3
"""What :meth:`ChunkedEnd.scan` returns when a size or trailer line is too long."""

_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


class ChunkedEnd:
    """Follows one chunked body across reads.

    Args:
        max_line_bytes: Longest size line, and most bytes of trailers in all.
    """

    __slots__ = ("_left", "_line", "_max_line_bytes", "_state", "_trailer_bytes")

    def __init__(self, max_line_bytes: int) -> None:
        self._state = _SIZE
        self._line = b""
        self._left = 0
        self._trailer_bytes = 0
        self._max_line_bytes = max_line_bytes

    def scan(self, data: bytes) -> int:
        """How many bytes of ``data`` end the body (the body's last byte is the one
        before that offset); -1 when all of them belong to it and it goes on;
        :data:`MALFORMED` or :data:`TOO_LONG` when the framing is bad."""
        at, size = 0, len(data)
        while at < size:
            if self._state == _DATA:
                taken = min(self._left, size - at)
                at += taken
                self._left -= taken
                if self._left == 0:
                    self._state = _DATA_END
                continue
            newline = data.find(b"\n", at)
            if newline < 0:
                self._line += data[at:]
                if len(self._line) > self._max_line_bytes:
                    return TOO_LONG
                return -1
            line = (self._line + data[at:newline]).rstrip(b"\r")
            self._line = b""
            at = newline + 1
            if self._state == _SIZE:
                try:
                    length = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    return MALFORMED
                if length < 0:
                    return MALFORMED
                self._state, self._left = (_TRAILER, 0) if length == 0 else (_DATA, length)
            elif self._state == _DATA_END:
                self._state = _SIZE
            else:  # a trailer line; the empty one ends the body
                if not line:
                    return at
                self._trailer_bytes += len(line)
                if self._trailer_bytes > self._max_line_bytes:
                    return TOO_LONG
        return -1
