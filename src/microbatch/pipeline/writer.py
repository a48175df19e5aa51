"""Writing to a worker's pipe from the event loop without ever blocking it.

A batch may be larger than the pipe holds (without ``/dev/shm`` its buffers travel
in the pipe), and the worker reads it only once it is done with the batch it runs.
A blocking write would stop the event loop until then, and for good if the worker
is meanwhile writing a large result that the stopped loop never reads. So frames
are queued here and written as the pipe takes them (``add_writer``), in order.
Frames are framed as :class:`multiprocessing.connection.Connection` frames them, so
the worker reads them with ``recv_bytes``.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections import deque
from collections.abc import Iterable

__all__ = ["PipeWriter"]

_SIZE = struct.Struct("!i")
_LARGE_SIZE = struct.Struct("!Q")


class PipeWriter:
    """The write end of one pipe, written from the running loop without blocking.

    Args:
        fd: The write end (made non-blocking; the caller keeps owning it).
    """

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._queue: deque[memoryview] = deque()
        self._queued = 0  # bytes ever queued
        self.taken = 0  # bytes the pipe has taken: a message ending before that is in it
        self._watching = False
        self._closed = False

    def write(self, frames: Iterable[bytes | memoryview]) -> int:
        """Queue ``frames`` (one message) behind what is queued, and write what the
        pipe takes now. Returns where the message ends: once :attr:`taken` reaches
        that, the whole message is in the pipe."""
        if self._closed:
            return self._queued + 1  # never taken
        was_empty = not self._queue
        for frame in frames:
            view = memoryview(frame).cast("B")
            size = view.nbytes
            head = (
                _SIZE.pack(size) if size <= 0x7FFFFFFF else _SIZE.pack(-1) + _LARGE_SIZE.pack(size)
            )
            if size <= 16384:
                self._queue.append(memoryview(head + bytes(view)))
            else:
                self._queue.append(memoryview(head))
                self._queue.append(view)
            self._queued += len(head) + size
        end = self._queued
        if was_empty:
            self._flush()
        return end

    def close(self) -> None:
        """Stop writing: what is still queued is dropped, later writes are ignored (the
        descriptor may be closed, and its number taken by another file)."""
        self._closed = True
        self._queue.clear()
        self._unwatch()

    def _flush(self) -> None:
        queue = self._queue
        while queue:
            chunk = queue[0]
            try:
                written = os.write(self._fd, chunk)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # the worker is gone: its sentinel tells the pool
                self.close()
                return
            self.taken += written
            if written == chunk.nbytes:
                queue.popleft()
            else:
                queue[0] = chunk[written:]
        if queue and not self._watching:
            asyncio.get_running_loop().add_writer(self._fd, self._flush)
            self._watching = True
        elif not queue:
            self._unwatch()

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            asyncio.get_running_loop().remove_writer(self._fd)
