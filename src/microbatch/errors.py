"""The exceptions microbatch raises to callers.

Every error carries the HTTP status it maps to (``http_status``), so the mapping to
HTTP lives with the error and nowhere else.
"""

from __future__ import annotations

import traceback

__all__ = [
    "BatcherClosed",
    "DeadlineExceeded",
    "ItemError",
    "ItemTooLarge",
    "MicrobatchError",
    "Overloaded",
    "RemoteError",
    "ResultLengthError",
    "SlowReader",
    "StageFailed",
    "WorkerDied",
]


class MicrobatchError(Exception):
    """Base class of every error raised by microbatch itself."""

    http_status: int = 500


class Overloaded(MicrobatchError):
    """The queue is full: the item was refused at once, nothing was queued."""

    http_status = 503


class BatcherClosed(MicrobatchError):
    """The batcher is closed (or closing) and takes no new items."""

    http_status = 503


class DeadlineExceeded(MicrobatchError):
    """The item's deadline passed before its result was ready.

    If the deadline passed while the item was still queued, the item was never
    computed.
    """

    http_status = 504


class ItemError(MicrobatchError):
    """Raise it in a model (or return it at an item's place) to fail that one item
    with a status of your choosing and a message that is safe to show the client.

    It behaves the same in every mode: in-process, in worker processes (it crosses
    the process boundary as itself), over HTTP (its status and message are the
    answer) and over every other protocol.

    Args:
        message: Shown to the client as it is: say what is wrong with the item.
        status: The HTTP status (a 4xx for a bad item; 422 by default).
    """

    http_status = 422

    def __init__(self, message: str, *, status: int = 422) -> None:
        if not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"status must be an HTTP error status (400-599), got {status!r}")
        super().__init__(message)
        self.message = message
        self.http_status = status

    def __reduce__(self) -> tuple[type[ItemError], tuple[str], dict[str, int]]:
        return type(self), (self.message,), {"http_status": self.http_status}


class ItemTooLarge(MicrobatchError, ValueError):
    """One item is larger than ``max_batch_size`` and cannot be split into parts."""

    http_status = 422


class ResultLengthError(MicrobatchError):
    """The batch function returned a list whose length differs from its input's."""

    http_status = 500


class WorkerDied(MicrobatchError):
    """The worker process running this item's batch died (crash, kill, out of memory)."""

    http_status = 503


class StageFailed(MicrobatchError):
    """A stage could not start: its workers kept dying while setting up the model."""

    http_status = 503


class RemoteError(MicrobatchError):
    """The model raised in a worker process; carries the original type, message and
    traceback text (the exception object itself stays in the worker)."""

    http_status = 500

    def __init__(self, type_name: str, message: str, traceback_text: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text

    def __reduce__(self) -> tuple[type[RemoteError], tuple[str, str, str]]:
        return type(self), (self.type_name, self.message, self.traceback_text)

    @classmethod
    def from_exception(cls, error: BaseException) -> RemoteError:
        """Describe ``error`` so that it can cross a process boundary."""
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        return cls(type(error).__qualname__, str(error), text)


class SlowReader(MicrobatchError):
    """The stream's caller read too slowly: ``max_buffered`` chunks waited unread,
    and the stream was ended (its item left at the next step). Over HTTP it is the
    stream's final error message, with status 408."""

    http_status = 408

    @classmethod
    def after(cls, buffered: int) -> SlowReader:
        """The error for a stream that had ``buffered`` chunks unread."""
        return cls(
            f"the client read the stream too slowly: {buffered} chunks waited unread, "
            "so the stream was ended"
        )
