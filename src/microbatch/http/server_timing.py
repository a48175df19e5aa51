"""``Server-Timing`` on every response of the ASGI app, not only a prediction's.

The app wraps each request's ``send`` (:func:`tell_timing`): a response head that
carries no ``Server-Timing`` of its own gets one from what is known about the
request (its :class:`ResponseTiming`): the record of a prediction that failed (the
stages it finished, the stage it failed in and the time there), else the error's
name and the total; a stream's head, the wait for its first chunk. A route says what
it knows through :func:`noted`, which finds the request's :class:`ResponseTiming`
without a parameter (a context variable: the request's task is the route's).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from contextvars import ContextVar, Token

from ..timing import SERVER_TIMING_HEADER, Timing, refused_value
from .asgi import Message, Send

__all__ = ["FIRST_CHUNK", "ResponseTiming", "forget", "note_error", "noted", "tell_timing"]

FIRST_CHUNK = b'first;dur=%.2f;desc="first chunk"'
"""A stream's ``Server-Timing`` at its head: from the request to its first chunk."""

_current: ContextVar[ResponseTiming | None] = ContextVar("microbatch_response_timing", default=None)


class ResponseTiming:
    """What one request's ``Server-Timing`` says when its route sends none.

    Attributes:
        started_s: When the request came in (``time.monotonic()``).
        timing: The prediction's record, once the route made one.
        error: The name of the error the request failed with (e.g. ``Overloaded``).
        stream: The response is a stream (its head says the wait for the first chunk).
    """

    __slots__ = ("error", "started_s", "stream", "timing")

    def __init__(self, started_s: float) -> None:
        self.started_s = started_s
        self.timing: Timing | None = None
        self.error = ""
        self.stream = False

    def value(self, status: int, end_s: float) -> bytes:
        """The header's value for a response of ``status`` sent at ``end_s`` (empty
        for a record kept only for a trace)."""
        timing = self.timing
        if timing is not None and not timing.told:
            return b""
        if status >= 400:
            error = self.error or str(status)
            if timing is None:
                return refused_value(end_s - self.started_s, error)
            return timing.failure_value(end_s, error)
        if self.stream:
            return FIRST_CHUNK % ((end_s - self.started_s) * 1e3)
        if timing is not None:
            return timing.header_value(end_s)
        return b"total;dur=%.2f" % ((end_s - self.started_s) * 1e3)


def noted() -> ResponseTiming | None:
    """The current request's :class:`ResponseTiming` (None outside a request, or
    when the app tells no ``Server-Timing``)."""
    return _current.get()


def note_error(name: str) -> None:
    """Say which error the current request failed with (a route that answers its own
    errors calls it; nothing happens outside a told request)."""
    told = _current.get()
    if told is not None:
        told.error = name


def tell_timing(send: Send, told: ResponseTiming) -> tuple[Send, Token[ResponseTiming | None]]:
    """``send`` that adds ``told``'s ``Server-Timing`` to a response head without
    one, and the token that makes ``told`` the current request's until reset with
    :func:`forget` (see :func:`noted`)."""
    token = _current.set(told)

    def send_with_timing(message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            headers = message.get("headers", ())
            if all(name != SERVER_TIMING_HEADER for name, _ in headers):
                value = told.value(message["status"], time.monotonic())
                if value:
                    message["headers"] = [*headers, (SERVER_TIMING_HEADER, value)]
        return send(message)

    return send_with_timing, token


def forget(token: Token[ResponseTiming | None]) -> None:
    """The request is answered: it is no longer the current one."""
    _current.reset(token)
