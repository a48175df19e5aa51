"""What the connection reads itself from a request's header block, beside the
parser: its HTTP version (one read of the request line's last bytes, compiled with
the hot path, where the parser's ``get_http_version()`` formats a string per request)."""

from __future__ import annotations

__all__ = ["says_http10"]


def says_http10(head: bytes) -> bool:
    """Whether the request line that starts ``head`` (after any empty lines) says
    ``HTTP/1.0``. The parser checks the line's form (it ends in ``HTTP/``, a digit, a
    dot, a digit and CRLF); this reads only those last digits, in a compiled loop,
    without the string that the parser's ``get_http_version()`` formats per request."""
    start = 0
    at = 0
    size = len(head)
    while at < size:
        if head[at] == 10:  # "\n": a line ends
            if at - start > 1:
                break  # the request line, head[start:at - 1]
            start = at + 1  # an empty line before it
        at += 1
    return (
        at < size
        and at - start > 4
        and head[at - 4] == 49  # "1"
        and head[at - 3] == 46  # "."
        and head[at - 2] == 48  # "0"
    )
