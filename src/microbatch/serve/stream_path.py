"""Streams on a connection without ASGI: ``POST /stream`` (and ``/stream/{route}``,
a predict path whose ``Accept`` asks for a stream, and the OpenAI completion routes'
streamed answers) written straight to the transport by one task per stream, through
the same chunk loop as the ASGI app (:func:`~microbatch.http.streams.write_stream`).
A request that its route leaves to the ASGI app (see
:class:`~microbatch.http.stream_route.NativeStreamRoute`) goes there, its body too.

The head goes out with the first chunk (or with the end, for a stream of none),
from the one callback that writes a step's chunks for every stream (see
:class:`~microbatch.http.direct_writes.DirectWriter`): the stream's task wakes for
its end. An error before the first chunk is an ordinary error response. The body is chunked
on HTTP/1.1 and delimited by the close on HTTP/1.0. A client that disconnects
cancels the task, which leaves the stream (its slot is freed at the next step).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from ..http.request_id import REQUEST_ID_HEADER
from ..http.server_timing import FIRST_CHUNK
from ..http.stream_route import NativeStreamRoute
from ..http.stream_writer import Framing, write_stream
from ..streams import stop_reading
from .fast_path import FastPath
from .limits import CLOSED
from .responses import CONTINUE, stream_head

__all__ = ["StreamPath"]

_CLIENT_CLOSED = 499  # recorded in metrics only: nobody is left to answer
_LAST_CHUNK = b"0\r\n\r\n"


class StreamPath(FastPath):
    """A connection's streams (see the module's docstring)."""

    def _give_to_asgi(self, body: bytes) -> None:
        """Answer the current request through the ASGI app, its whole ``body`` read
        already."""
        raise NotImplementedError

    def _take_stream(self, route: NativeStreamRoute, has_body: bool) -> bool:
        """The request's headers are in and ask for a stream: check them now (an
        error is answered at once; the body is then read and dropped). False: the
        route leaves the request to the ASGI app."""
        try:
            checked = route.check(self._named)
        except Exception as error:
            checked = error
        if checked is None:
            return False
        self._stream_route = route
        self._request_id = route.request_id(self._header(REQUEST_ID_HEADER))
        if isinstance(checked, Exception):
            self._answer_error(checked, route)
        else:
            self._stream_checked = checked
            if has_body and self._continue:
                self._write(CONTINUE)
        return True

    def _open_stream(self, route: NativeStreamRoute, checked: object, body: bytes) -> None:
        """The whole body is in: open the stream and start writing it, or give the
        request to the ASGI app."""
        try:
            opened = route.open(checked, body, self._headers)
        except Exception as error:
            self._answer_error(error, route)
            return
        if opened is None:
            self._stream_route = self._stream_checked = None
            self._give_to_asgi(body)
            return
        writing = self._write_stream(route, opened.chunks, opened.framing)
        self._task = self._loop.create_task(writing)

    async def _write_stream(
        self, route: NativeStreamRoute, chunks: AsyncIterator[Any], framing: Framing
    ) -> None:
        try:
            status = await write_stream(_ConnectionOut(self, route, framing), chunks, framing)
        except asyncio.CancelledError:
            self._record(route.label, _CLIENT_CLOSED)
            return  # the client went away (the only canceller)
        except Exception as error:  # before the first chunk: nothing was sent
            self._task = None
            self._answer_error(error, route)
            return
        finally:
            await stop_reading(chunks)
        self._task = None
        self._record(route.label, status)
        self.response_complete(status)


class _ConnectionOut:
    """:class:`~microbatch.http.streams.StreamOut` on a connection: chunked framing
    on HTTP/1.1; on HTTP/1.0 the body runs to the close."""

    __slots__ = ("_chunked", "_connection", "_framing", "_route")

    @property
    def writes_now(self) -> bool:
        """Always: the connection writes at once unless its client reads slowly."""
        return True

    @property
    def begins_now(self) -> bool:
        """Always: the head is written as the chunks are."""
        return True

    def __init__(self, connection: StreamPath, route: NativeStreamRoute, framing: Framing) -> None:
        self._connection = connection
        self._route = route
        self._framing = framing
        self._chunked = not connection._http10
        if not self._chunked:
            connection._keep_alive = False  # the close ends the body

    async def begin(self, first: bytes) -> None:
        self._begin(first)

    def begin_now(self, first: bytes) -> bool:
        if self._connection._phase == CLOSED:
            return False
        self._begin(first)
        return True

    def _begin(self, first: bytes) -> None:
        connection = self._connection
        lines = connection._request_id_line() + connection._connection_line()
        if self._route.tells:
            elapsed_ms = (time.monotonic() - connection._started) * 1e3
            lines += b"server-timing: " + FIRST_CHUNK % elapsed_ms + b"\r\n"
        out = stream_head(self._framing.media_type, self._chunked, lines)
        connection._write(out + self._frame(first) if first else out)

    async def more(self, body: bytes) -> None:
        connection = self._connection
        connection._write(self._frame(body))
        await connection.drained()

    def write_now(self, body: bytes) -> bool:
        connection = self._connection
        if connection._phase == CLOSED or connection._write_paused:
            return False
        connection._write(self._frame(body))
        return True

    async def end(self, final: bytes) -> None:
        self._connection._write(self._frame(final) + _LAST_CHUNK if self._chunked else final)

    def _frame(self, body: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(body), body) if self._chunked else body
