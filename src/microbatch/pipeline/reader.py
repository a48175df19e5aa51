"""Reading a worker's results pipe from the event loop without ever blocking it.

Bytes are read as they arrive (the loop calls :meth:`MessageReader.messages` when the
pipe is readable) and handed on as whole messages once complete, so a large result
coming through the pipe (without ``/dev/shm``) never holds the loop while the worker
is still writing it. Frames are as :class:`multiprocessing.connection.Connection`
frames them (the worker writes with ``send_bytes``).
"""

from __future__ import annotations

import os
import struct

from .transport import Incoming, begin

__all__ = ["MessageReader"]

_SIZE = struct.Struct("!i")
_LARGE_SIZE = struct.Struct("!Q")
_CHUNK = 256 * 1024


class MessageReader:
    """The read end of one pipe, read from the running loop without blocking.

    Args:
        fd: The read end (made non-blocking; the caller keeps owning it).
    """

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
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
