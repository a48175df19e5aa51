"""Logging requests that failed inside the server (500-class answers), with repeated
identical tracebacks rate-limited: the first in full, then one line with a count per
window while they keep coming, so that a model failing every request does not flood
the log (2,789 bad requests once wrote 55,785 lines in 3 s)."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import MicrobatchError, RemoteError
from .status import HttpError

__all__ = ["RepeatedErrorLog"]

_MAX_KINDS = 256  # distinct tracebacks remembered; the oldest is forgotten beyond


@dataclass
class _Seen:
    first_request_id: str  # whose line has the full traceback
    reported_at: float  # when its last line went out
    repeats: int = 0  # not logged since then


class RepeatedErrorLog:
    """Logs failed requests on ``logger``; an error with the same type and frames as
    one logged before is counted, and the count logged at most once per ``window_s``
    (and by :meth:`flush`).

    Args:
        logger: Where the lines go (ERROR level).
        now: The clock (seconds, monotonic).
        window_s: Least time between two lines about one kind of error.
    """

    def __init__(
        self,
        logger: logging.Logger,
        now: Callable[[], float] = time.monotonic,
        window_s: float = 60.0,
    ) -> None:
        self._logger = logger
        self._now = now
        self._window_s = window_s
        self._seen: dict[tuple[str, ...], _Seen] = {}

    def failed(self, request_id: str, error: BaseException) -> None:
        """Request ``request_id`` failed with ``error``: log it, or count it."""
        type_name, message, text = _described(error)
        what = _what(error)
        key = (what, type_name, *_frames(text))
        now = self._now()
        seen = self._seen.get(key)
        if seen is None:
            if len(self._seen) >= _MAX_KINDS:
                del self._seen[next(iter(self._seen))]
            self._seen[key] = _Seen(request_id, now)
            self._logger.error(
                "request %s: %s %s: %s\n%s",
                request_id,
                what,
                type_name,
                message,
                text.rstrip("\n"),
                extra={"request_id": request_id},
            )
            return
        seen.repeats += 1
        if now - seen.reported_at >= self._window_s:
            self._report(what, type_name, seen, now)

    def flush(self) -> None:
        """Log the counts not logged yet (at shutdown)."""
        now = self._now()
        for key, seen in self._seen.items():
            if seen.repeats:
                self._report(key[0], key[1], seen, now)

    def _report(self, what: str, type_name: str, seen: _Seen, now: float) -> None:
        self._logger.error(
            "%s %s %d more time(s) in the last %.0f s, with the traceback logged for request %s",
            what,
            type_name,
            seen.repeats,
            now - seen.reported_at,
            seen.first_request_id,
        )
        seen.repeats = 0
        seen.reported_at = now


def _described(error: BaseException) -> tuple[str, str, str]:
    """Type name, message and traceback text of a failure (from a worker or not)."""
    if isinstance(error, RemoteError):
        return error.type_name, error.message, error.traceback_text
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return type(error).__qualname__, str(error), text


def _what(error: BaseException) -> str:
    """The model's own errors (from a worker, or raised in-process) and ours."""
    if isinstance(error, (MicrobatchError, HttpError)) and not isinstance(error, RemoteError):
        return "failed with"
    return "the model raised"


def _frames(text: str) -> list[str]:
    """The ``File ..., line ..., in ...`` lines: where it was raised, not the message."""
    return [line for line in text.splitlines() if line.lstrip().startswith('File "')]
