"""The exceptions microbatch raises to callers.

Every error carries the HTTP status it maps to (``http_status``), so the mapping to
HTTP lives with the error and nowhere else.
"""

from __future__ import annotations

__all__ = [
    "BatcherClosed",
    "DeadlineExceeded",
    "ItemTooLarge",
    "MicrobatchError",
    "Overloaded",
    "ResultLengthError",
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
