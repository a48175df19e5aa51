"""One HTTP/1.1 connection of ``microbatch serve``: httptools parses, this module keeps
the connection's state, its limits and its single timer.

**Strict on every request.** A request's headers are held back from the parser until
their blank line has arrived, so their size cap is exact (also for a pipelined
request, and when the blank line is split across reads) and nothing past the cap is
ever buffered. A body is fed to the parser exactly to its ``Content-Length``, so the
next pipelined request starts on a boundary; the next request is parsed only once
the previous response is out. Deadlines: headers ``header_timeout_s`` after the
connection opened or the previous response went out (an idle kept-alive connection
closes after ``keep_alive_s``), a body ``body_timeout_s`` after its headers — also
when it is being discarded after an early response; then 408 and close.

**Cheap on the hot path.** ``POST /predict`` (and ``/predict/{route}``) skip ASGI:
the headers the route reads are taken from one list, the body is decoded with
msgspec from its bytes, the servable's ``submit`` runs in one task, and the
response goes out in one write. One timer per connection serves every request: it
is moved only to an earlier time, and re-armed when it fires before a deadline that
moved later. A stream (``POST /stream``, or a predict path whose ``Accept`` asks for
one) skips ASGI too: one task writes its chunks straight to the transport
(:mod:`.stream_path`). Every other route goes through the ASGI app
(:mod:`.asgi_cycle`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import unquote

import httptools

from ..http.asgi import BODY_DEADLINE_EXTENSION, DISCONNECT_EXTENSION
from ..http.predict import content_length
from ..http.request_id import REQUEST_ID_HEADER
from ..http.status import BodyTooLarge
from ..http.streams import wants_stream
from .asgi_cycle import AsgiCycle
from .chunked import TOO_LONG, ChunkedEnd
from .limits import BODY, CLOSED, HEAD, WAIT, ConnectionOwner
from .request_line import says_http10
from .responses import BAD_REQUEST, CONTINUE, HEADERS_TOO_LARGE, SERVICE_UNAVAILABLE
from .stream_path import StreamPath

__all__ = ["HttpConnection"]

logger = logging.getLogger("microbatch.serve")

_BLANK_LINE = b"\r\n\r\n"
_ASGI = {"version": "3.0", "spec_version": "2.3"}


class _ClosedParser:
    """Stands in for a closed connection's parser (which referred back to it)."""

    def feed_data(self, data: bytes) -> None:
        raise httptools.HttpParserError("the connection is closed")


_CLOSED_PARSER: Any = _ClosedParser()


class HttpConnection(StreamPath):
    """One client connection (see the module's docstring).

    Args:
        front: What the server's connections share.
    """

    def __init__(self, front: ConnectionOwner) -> None:
        super().__init__(front)
        self._parser: Any = httptools.HttpRequestParser(self)

    # -- asyncio.Protocol --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Count the connection against the cap; start waiting for a request."""
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self._transport = transport
        front = self._front
        if len(front.connections) >= self._limits.max_connections or front.closing:
            self._head_since = self._clock.now()  # refused at once: its total is 0
            transport.write(SERVICE_UNAVAILABLE.reply(self._refusal_timing(SERVICE_UNAVAILABLE)))
            self._phase = CLOSED
            transport.close()
            return
        front.connections.add(self)
        # Asked once per connection (each is a system call): every request's scope has them.
        self._sockname = transport.get_extra_info("sockname")
        peer = self._peername = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self._client = f"{peer[0]}:{peer[1]}"
        self._await_request()

    def data_received(self, data: bytes) -> None:
        """Hold the bytes; parse what the connection's phase allows."""
        if self._phase == CLOSED:
            return
        self._buffer = self._buffer + data if self._buffer else data
        if not self._processing:
            self._process()

    def eof_received(self) -> bool | None:
        """The client will send no more: it is gone (as for uvicorn; a half-closed
        client waiting for a response is not told apart from one that left)."""
        return None  # the transport closes; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the timer; cancel a running prediction; tell the ASGI app."""
        self._phase = CLOSED
        self._stop_timer()
        self._front.forget(self)
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
        pending = self._pending
        if pending is not None:
            pending.cancel()  # withdraws the item; _predicted records the leaving
        cycle = self._cycle
        if cycle is not None:
            cycle.disconnect()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()
        # The parser refers back to this protocol: break the cycle now, and drop what
        # the last request held, rather than leave it to the cyclic collector.
        self._parser = _CLOSED_PARSER
        self._buffer = b""
        self._body = []
        self._headers = []
        self._named = {}
        self._cycle = None

    def pause_writing(self) -> None:
        """The client reads slower than we write."""
        self._write_paused = True

    def resume_writing(self) -> None:
        """The client caught up: wake writers, parse what waited."""
        self._write_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()
        if self._phase == HEAD and self._buffer and not self._processing:
            self._resume_reading()
            self._process()

    # -- feeding the parser ------------------------------------------------------

    def _process(self) -> None:
        """Give the parser what it may have now: a whole header block, or body bytes
        up to the body's end. Stop while a response is pending."""
        self._processing = True
        try:
            while self._buffer:
                phase = self._phase
                if phase == HEAD:
                    if self._write_paused or not self._take_head():
                        break
                elif phase == BODY:
                    self._take_body()
                else:
                    break
        finally:
            self._processing = False
        if self._buffer and (self._phase == WAIT or self._write_paused):
            self._pause_reading()  # a pipelined request waits for this response

    def _take_head(self) -> bool:
        """Feed the next header block if its blank line is in; False if not yet."""
        buffer = self._buffer
        end = buffer.find(_BLANK_LINE, max(0, self._scanned - 3))
        limit = self._limits.max_header_bytes
        if end < 0:
            if len(buffer) > limit:
                self._refuse(HEADERS_TOO_LARGE)
            else:
                self._scanned = len(buffer)
            return False
        end += 4
        if end > limit:
            self._refuse(HEADERS_TOO_LARGE)
            return False
        self._scanned = 0
        self._http10 = says_http10(buffer)
        if end == len(buffer):
            self._buffer = b""
            self._feed(buffer)
        else:
            self._buffer = buffer[end:]
            self._feed(buffer[:end])
        return True

    def _take_body(self) -> None:
        buffer = self._buffer
        remaining = self._remaining
        chunked = self._chunked
        if chunked is not None:  # up to the body's end, as its framing says
            end = chunked.scan(buffer)
            if end == TOO_LONG:
                self._refuse(HEADERS_TOO_LARGE)
                return
            remaining = len(buffer) if end < 0 else end  # MALFORMED: the parser says so
        if remaining >= len(buffer):
            self._buffer = b""
            self._feed(buffer)
        else:
            self._buffer = buffer[remaining:]
            self._feed(buffer[:remaining])
        if chunked is not None and end >= 0 and not self._message_done and self._phase == BODY:
            self._refuse(BAD_REQUEST)  # the parser and the framing disagree

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._keep_alive = False  # no protocol switch: the request is answered, then close
            self._ignore_parser = True
            self._buffer = b""
        except httptools.HttpParserError:
            if self._ignore_parser:
                self._buffer = b""
            elif self._phase in (HEAD, BODY) and not self._responded and not self._started_asgi:
                self._refuse(BAD_REQUEST)
            else:
                self._abort_request()

    # -- httptools callbacks -----------------------------------------------------

    def on_message_begin(self) -> None:
        """A request starts."""
        if self._ignore_parser:
            return
        self._url = b""
        self._headers = []
        self._named = {}
        self._remaining = 0
        self._chunked = None
        self._continue = False
        self._message_done = False
        self._responded = False
        self._body = []
        self._body_size = 0
        self._predictor = None
        self._checked = None
        self._stream_route = None
        self._stream_checked = None
        self._cycle = None
        self._timing = None

    def on_url(self, url: bytes) -> None:
        """A piece of the request target."""
        if not self._ignore_parser:
            self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header, kept in order and by name (names in lower case)."""
        if self._ignore_parser:
            return
        name = name.lower()
        self._headers.append((name, value))
        self._named[name] = value

    def on_headers_complete(self) -> None:
        """The request's headers are in: take it on the fast path, as a stream, or
        through ASGI."""
        if self._ignore_parser:
            return
        self._take_framing(self._named)
        parser = self._parser
        self._started = time.monotonic()  # the batcher's clock: Server-Timing starts here
        self._keep_alive = parser.should_keep_alive() and not self._front.closing
        remaining = self._remaining
        has_body = remaining != 0
        self._phase = BODY
        if has_body and (remaining < 0 or len(self._buffer) < remaining):
            self._read_by(self._clock.now() + self._limits.body_timeout_s)
        else:  # no body, or all of it came with the headers: it is fed now
            self._due = math.inf
        method = parser.get_method()
        url = self._url
        path, _, query = url.partition(b"?")
        if method != b"POST":
            self._start_asgi(method, path, query)
            return
        front = self._front
        streams = front.streams
        if streams:  # a stream route, or a predict path whose Accept asks for a stream
            route = streams.get(path)
            if (
                route is not None
                and (path not in front.predictors or wants_stream(self._header(b"accept")))
                and self._take_stream(route, has_body)
            ):
                return
        predictor = front.predictors.get(path)
        if predictor is not None:
            self._predictor = predictor
            self._request_id = predictor.request_id(self._named.get(REQUEST_ID_HEADER))
            try:
                self._checked = predictor.check(self._named)
            except Exception as error:
                self._answer_error(error, predictor)  # the body is read and dropped
                return
            if has_body and self._continue:
                self._write(CONTINUE)
            return
        self._start_asgi(method, path, query)

    def _take_framing(self, named: dict[bytes, bytes]) -> None:
        """How the body is delimited, and whether the client waits for ``100 Continue``."""
        if b"transfer-encoding" in named:  # over Content-Length (the parser refuses both)
            self._remaining = -1
            self._chunked = ChunkedEnd(self._limits.max_header_bytes)
        else:
            length = named.get(b"content-length")
            if length is not None:
                size = content_length(length)
                self._remaining = size if size >= 0 else 0  # else the parser refuses it
        expect = named.get(b"expect")
        if expect is not None:
            self._continue = expect.lower() == b"100-continue"

    def on_body(self, body: bytes) -> None:
        """A piece of the body: kept (fast path), handed on (ASGI) or dropped (the
        response went out already)."""
        if self._ignore_parser:
            return
        if self._remaining > 0:
            self._remaining -= len(body)
        if self._responded:
            return
        cycle = self._cycle
        if cycle is not None:
            cycle.body(body)
            return
        self._body.append(body)
        self._body_size += len(body)
        route = self._predictor or self._stream_route
        if route is not None and self._body_size > route.max_body_bytes:
            self._answer_error(
                BodyTooLarge(f"the body is over the limit of {route.max_body_bytes} bytes"),
                route,
            )

    def on_message_complete(self) -> None:
        """The whole request is in: predict, or let the ASGI app have the body's end."""
        if self._ignore_parser:
            return
        self._message_done = True
        self._remaining = 0
        if self._responded:
            self._request_finished()
            return
        self._phase = WAIT
        self._due = math.inf  # no read deadline while the request is answered
        cycle = self._cycle
        if cycle is not None:
            cycle.body_complete()
            return
        predictor, checked = self._predictor, self._checked
        if predictor is None or checked is None:
            stream_route, stream_checked = self._stream_route, self._stream_checked
            if stream_route is not None and stream_checked is not None:
                self._open_stream(stream_route, stream_checked, self._take_whole_body())
            return
        body = self._take_whole_body()
        try:
            timing = self._timing = predictor.timing(self._headers, self._started)
            pending = predictor.submit(checked, body, timing)
        except Exception as error:
            self._answer_error(error, predictor)
            return
        if isinstance(pending, asyncio.Future):  # queued: no task, a callback
            self._pending = pending
            self._encoder = checked.encoder
            pending.add_done_callback(self._predicted)
            return
        predicted = self._predict(pending, checked.encoder, predictor, timing)
        self._task = self._loop.create_task(predicted)

    def _take_whole_body(self) -> bytes:
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        return body

    # -- the ASGI path -----------------------------------------------------------

    def _give_to_asgi(self, body: bytes) -> None:
        """Answer the current request through the ASGI app, its whole ``body`` read
        already (a stream route left it there once it had read it)."""
        path, _, query = self._url.partition(b"?")
        self._start_asgi(self._parser.get_method(), path, query)
        cycle = self._cycle
        assert cycle is not None
        if body:
            cycle.body(body)
        cycle.body_complete()

    def _start_asgi(self, method: bytes, path: bytes, query: bytes) -> None:
        head_only = method == b"HEAD"
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": "1.0" if self._http10 else "1.1",
            "server": self._sockname,
            "client": self._peername,
            "scheme": "http",
            "method": "GET" if head_only else method.decode("ascii"),
            "root_path": "",
            "path": unquote(path.decode("latin-1")),
            "raw_path": path,
            "query_string": query,
            "headers": self._headers,
            "extensions": {
                DISCONNECT_EXTENSION: {"register": self._register_disconnect},
                BODY_DEADLINE_EXTENSION: {"timeout_s": self._limits.body_timeout_s},
            },
        }
        cycle = self._cycle = AsgiCycle(self, scope, head_only, self._connection_line())
        if self._remaining != 0 and self._continue:
            self._write(CONTINUE)
        # A finished task stays referred to until the next request or the close
        # (connection_lost cancels only one still running): no done callback per request.
        self._task = self._loop.create_task(cycle.run(self._front.app))

    def _register_disconnect(self, callback: Callable[[], None]) -> None:
        cycle = self._cycle
        if cycle is not None:
            cycle.on_disconnect = callback

    # -- CycleOwner (and the fast path's writes) ---------------------------------

    def hold_body(self, held: bool) -> None:
        """The ASGI app holds too much unread body (True), or caught up (False)."""
        self._held_for_app = held
        if held:
            self._pause_reading()
        elif not (self._buffer and self._phase == WAIT):
            self._resume_reading()

    def abort(self) -> None:
        """Close now, without a response."""
        self._close()

    def close_after_response(self) -> None:
        """Close once the current response is out (its body runs to the close)."""
        self._keep_alive = False

    def response_complete(self, status: int) -> None:
        """The current response is out: on to the next request, or close."""
        self._responded = True
        self._body = []
        if self._message_done:
            self._request_finished()
        # else: the body is still coming; it is read and dropped, under its deadline

    def _request_finished(self) -> None:
        if self._phase == CLOSED:
            return
        cycle = self._cycle
        if cycle is not None and not cycle.complete:
            return  # the app is still answering (it may stream after reading the body)
        if not self._keep_alive or self._front.closing:
            self._close()
            return
        self._await_request()
        self._resume_reading()
        if self._buffer and not self._processing:
            self._process()

    def _abort_request(self) -> None:
        """A parse error once a response began: nothing valid can follow; close."""
        self._close()

    # -- phases, deadlines -------------------------------------------------------

    def _await_request(self) -> None:
        self._phase = HEAD
        self._cycle = None  # the request's other state is reset as the next one begins
        self._head_since = now = self._clock.now()
        self._read_by(now + self._head_wait_s)

    def shut_down(self) -> None:
        """The server drains: close if idle, else after the current response."""
        self._keep_alive = False
        if self._phase == HEAD and not self._buffer:
            self._close()

    # -- closing -----------------------------------------------------------------
