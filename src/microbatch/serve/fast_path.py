"""The fast path of ``POST /predict`` (and ``/predict/{route}``) on a connection: the
result of a queued item answered from its future's callback (no task), or of a
servable's coroutine from one task; errors answered as their route says
(``error_answer``); every response in one write."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from ..http.codecs import Codec
from ..http.predict import ErrorAnswer, Predictor, encode_result
from ..timing import Timing, failure_line
from .connection_base import ConnectionBase
from .limits import CLOSED
from .responses import head, ok_head

__all__ = ["FastPath", "NativeRoute"]

_CLOSE = b"connection: close\r\n"
_KEEP_ALIVE = b"connection: keep-alive\r\n"
_CLIENT_CLOSED = 499  # recorded in metrics only: nobody is left to answer


class NativeRoute(Protocol):
    """What answering a route's errors needs of it (a :class:`Predictor`, or a
    :class:`~microbatch.http.stream_route.NativeStreamRoute`)."""

    label: str
    max_body_bytes: int
    tells: bool

    def error_answer(self, error: Exception, accept: bytes | None, request_id: str) -> ErrorAnswer:
        """How the route answers ``error``."""


class FastPath(ConnectionBase):
    """A connection's answers on the fast path (see the module's docstring)."""

    def response_complete(self, status: int) -> None:
        """The current response is out (the connection goes on from there)."""
        raise NotImplementedError

    def _predicted(self, future: asyncio.Future[Any]) -> None:
        """The queued item's result is in (or it failed, or the client left)."""
        if future is not self._pending:
            return
        self._pending = None
        predictor = self._predictor
        assert predictor is not None
        if future.cancelled():
            self._record(predictor.label, _CLIENT_CLOSED)
            return
        try:
            body = encode_result(self._encoder, future.result())
        except Exception as error:
            self._answer_error(error, predictor)
            return
        self._answer(body, self._encoder, predictor, self._timing)

    async def _predict(
        self, pending: Awaitable[Any], encoder: Codec, predictor: Predictor, timing: Timing | None
    ) -> None:
        try:
            result = await pending
            body = encode_result(encoder, result)
        except asyncio.CancelledError:
            self._record(predictor.label, _CLIENT_CLOSED)
            return  # the client went away (the only canceller)
        except Exception as error:
            self._task = None
            self._answer_error(error, predictor)
            return
        self._task = None
        self._answer(body, encoder, predictor, timing)

    def _answer(
        self, body: bytes, encoder: Codec, predictor: Predictor, timing: Timing | None
    ) -> None:
        """Answer the current request with its encoded result."""
        if self._phase == CLOSED:
            return
        lines = self._request_id_line() + self._connection_line()
        now = time.monotonic()  # one clock read: Server-Timing's end and the log's seconds
        if timing is not None:
            lines += timing.header_line(now)
        self._write(ok_head(encoder.media_type, len(body), lines) + body)
        self._record(predictor.label, 200, now)
        self.response_complete(200)

    def _answer_error(self, error: Exception, route: NativeRoute) -> None:
        """Answer the current request with an error response."""
        if self._phase == CLOSED:
            self._record(route.label, _CLIENT_CLOSED)
            return
        answer = route.error_answer(error, self._header(b"accept"), self._request_id)
        lines = self._request_id_line() + self._connection_line()
        now = time.monotonic()
        if route.tells:  # what is known: the stage it failed in, time there, total
            lines += failure_line(self._timing, now - self._started, now, answer.name)
        body = answer.body
        self._write(head(answer.status, answer.media_type, len(body), answer.headers, lines) + body)
        self._record(route.label, answer.status, now)
        self.response_complete(answer.status)

    def _record(self, label: str, status: int, now: float | None = None) -> None:
        """Count and log the response (``now``: when it was answered, on
        ``time.monotonic()``'s clock like :attr:`_started`; read here when not given)."""
        seconds = (time.monotonic() if now is None else now) - self._started
        self._front.record(label, status, seconds, self._request_id, self._client)

    def _request_id_line(self) -> bytes:
        return b"x-request-id: " + self._request_id.encode("ascii") + b"\r\n"

    def _header(self, name: bytes) -> bytes | None:
        return self._named.get(name)

    def _connection_line(self) -> bytes:
        if not self._keep_alive:
            return _CLOSE
        if self._http10:
            return _KEEP_ALIVE
        return b""
