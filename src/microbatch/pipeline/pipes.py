"""The serving side's ends of a worker's pipes, used from the event loop without
ever blocking it.

A batch may be larger than the pipe holds (without ``/dev/shm`` its buffers travel
in the pipe), and the worker reads it only once it is done with the batch it runs.
A blocking write would stop the event loop until then, and for good if the worker
is meanwhile writing a large result that the stopped loop never reads. So the
:class:`PipeWriter` queues frames and writes them as the pipe takes them
(``add_writer``), in order; and the :class:`MessageReader` reads results as their
bytes arrive (the loop calls it when the pipe is readable) and hands them on whole,
so a large result never holds the loop while the worker is still writing it.
Frames are framed as :class:`multiprocessing.connection.Connection` frames them: the
worker's ends are plain blocking Connections.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections import deque
from collections.abc import Iterable

from .transport import Incoming, begin

__all__ = ["MessageReader", "PipeWriter"]

_SIZE = struct.Struct("!i")  # a frame's length; -1: the length follows as _LARGE_SIZE
_LARGE_SIZE = struct.Struct("!Q")
_CHUNK = 64 * 1024  # bytes read at once (a larger read buffer is mmap-ed and unmapped per read)


class _End:
    """One end of a pipe, made non-blocking (the caller keeps owning the descriptor)."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd


class PipeWriter(_End):
    """The batches pipe's write end: messages queued, written as the pipe takes them."""

    def __init__(self, fd: int) -> None:
        super().__init__(fd)
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


class MessageReader(_End):
    """The results pipe's read end: whole messages as their bytes arrive."""

    def __init__(self, fd: int) -> None:
        super().__init__(fd)
        self._buffer = bytearray()
        self._partial: Incoming | None = None  # its header came, some frames did not
        self._ended = False

    def messages(self) -> list[Incoming]:
        """The messages completed by what the pipe holds now (maybe none).

        Raises:
            EOFError: The pipe has ended, and every complete message was handed out.
            OSError: The pipe cannot be read.
        """
        self._fill()
        complete: list[Incoming] = []
        for frame in self._frames():
            message = self._partial if self._partial is not None else begin(frame)
            if message is self._partial:
                message.frames.append(frame)
            if len(message.frames) == message.frames_expected:
                complete.append(message)
                self._partial = None
            else:
                self._partial = message
        if not complete and self._ended:
            raise EOFError("the pipe has ended")
        return complete

    def _fill(self) -> None:
        while not self._ended:
            try:
                chunk = os.read(self._fd, _CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            if not chunk:
                self._ended = True
                return
            self._buffer += chunk
            if len(chunk) < _CHUNK:  # the pipe is empty now: spare a read that says so
                return

    def _frames(self) -> list[bytes]:
        """Cut the complete frames off the front of the buffer."""
        buffer, at, frames = self._buffer, 0, []
        with memoryview(buffer) as view:
            while len(buffer) - at >= _SIZE.size:
                (size,) = _SIZE.unpack_from(buffer, at)
                head = _SIZE.size
                if size == -1:
                    if len(buffer) - at < head + _LARGE_SIZE.size:
                        break
                    (size,) = _LARGE_SIZE.unpack_from(buffer, at + head)
                    head += _LARGE_SIZE.size
                if len(buffer) - at - head < size:
                    break
                frames.append(view[at + head : at + head + size].tobytes())
                at += head + size
        if at:
            del buffer[:at]
        return frames
