"""The exceptions microbatch raises to callers.

Every error carries the HTTP status it maps to (``http_status``), so the mapping to
HTTP lives with the error and nowhere else.
"""

from __future__ import annotations

import traceback

__all__ = [
    "BatcherClosed",
    "DeadlineExceeded",
    "ItemTooLarge",
    "MicrobatchError",
    "Overloaded",
    "RemoteError",
    "ResultLengthError",
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
