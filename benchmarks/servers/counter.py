"""Batches and items a server's model has run, in a 16-byte file the harness reads.

Free of any framework, so every contender's virtualenv can import it. The file holds
two little-endian int64 (batches, items), rewritten with one ``pwrite`` per batch;
the harness reads it before and after a run to get the mean batch size.
"""

from __future__ import annotations

import os
import struct

__all__ = ["BatchCounter", "read_counter"]

_RECORD = struct.Struct("<qq")


class BatchCounter:
    """Counts batches and items; writes the totals to ``path`` (if given) each time."""

    def __init__(self, path: str | None) -> None:
        self.batches = self.items = 0
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644) if path else None

    def add(self, items: int) -> None:
        """Count one batch of ``items``."""
        self.batches += 1
        self.items += items
        if self._fd is not None:
            os.pwrite(self._fd, _RECORD.pack(self.batches, self.items), 0)


def read_counter(path: str) -> tuple[int, int]:
    """``(batches, items)`` written so far to a counter file ((0, 0) if none yet)."""
    try:
        with open(path, "rb") as file:
            data = file.read(_RECORD.size)
    except FileNotFoundError:
        return 0, 0
    return _RECORD.unpack(data) if len(data) == _RECORD.size else (0, 0)
