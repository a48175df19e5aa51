"""Shared memory between the serving process and one worker process: the arena.

Buffers of at least :data:`ARENA_MIN_BYTES` (numpy arrays, large pickles) are
copied into shared memory instead of being pushed through the pipe, which then
carries only where they lie. A worker has one *slot* per batch it may hold (the
one it runs and the next, waiting), and each slot has two files: the batch's
buffers (serving process to worker) and its result's (back). Each file has one
writer and one reader. A slot belongs to one batch from the moment it is sent
until its result has been copied out in the serving process, so a file is never
written while the other side may still read it; and each side copies out what it
receives, so nothing handed on points into shared memory.

The files live in ``/dev/shm`` (tmpfs: memory, never disk). The serving process
creates them (mode 0600, random names, ``O_EXCL``), the worker opens them before
it sets up its model, and the serving process unlinks the names as soon as the
worker is set up, or has died: from then on the memory lives exactly as long as
the two processes hold it open, and the kernel frees it however they exit. Until
then the names are registered with multiprocessing's resource tracker, which
unlinks them should the serving process die first.

A file grows when a message does not fit, and does not shrink. Its writer reserves
the space with ``posix_fallocate`` first, so a full ``/dev/shm`` is an ``OSError``
the sender handles (the message then goes through the pipe), never a SIGBUS.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import sys
import weakref
from collections.abc import Sequence
from multiprocessing import resource_tracker
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["ARENA_MIN_BYTES", "Arena", "FileReader", "Segment", "new_buffer"]

ARENA_MIN_BYTES = 64 * 1024  # smaller buffers travel inside the pickle, in the pipe
SHM_DIR = Path("/dev/shm")
_TRACKED = "shared_memory"  # the resource tracker's kind: unlinks "/name" under /dev/shm


class Segment:
    """One file of the arena, mapped into this process.

    Args:
        fd: The open file (the segment owns it from now on).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._map: mmap.mmap | None = None
        self._mapped = 0

    def reserve(self, size: int) -> None:
        """Make room for ``size`` bytes from offset 0, growing the file if needed.

        Raises:
            OSError: The memory cannot be had (``/dev/shm`` is full).
        """
        if size > self._mapped:
            size = max(size, 2 * self._mapped)
            os.posix_fallocate(self._fd, 0, size)
            self._remap(size)

    def write(self, offset: int, data: memoryview) -> None:
        """Copy ``data`` (contiguous bytes) to ``offset``, inside the reserved room."""
        assert self._map is not None and offset + data.nbytes <= self._mapped
        self._map[offset : offset + data.nbytes] = data

    def read(self, offset: int, length: int) -> Any:
        """A copy of ``length`` bytes at ``offset`` (a writable buffer, see
        :func:`new_buffer`), which the caller may keep."""
        if offset + length > self._mapped:  # the writer grew the file
            self._remap(os.fstat(self._fd).st_size)
        if self._map is None or offset < 0 or offset + length > self._mapped:
            raise OSError(f"bytes {offset}..{offset + length} lie outside the segment")
        out = new_buffer(length)
        with memoryview(self._map) as view, memoryview(out) as copy:
            copy[:] = view[offset : offset + length]
        return out

    def reader(self) -> FileReader:
        """A reader of this file with a descriptor of its own, for another thread:
        closing the segment meanwhile does not pull the file from under it."""
        return FileReader(os.dup(self._fd))

    def close(self) -> None:
        """Unmap the file and close it."""
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:  # an arena dropped without close() keeps no descriptor
        with contextlib.suppress(Exception):
            self.close()

    def _remap(self, size: int) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        self._mapped = 0
        if size > 0:
            self._map = mmap.mmap(self._fd, size)
            self._mapped = size


class FileReader:
    """Reads a segment's file with ``preadv``, which lets other threads run (the GIL
    is released while the kernel copies). Closes its descriptor on exit.

    Args:
        fd: A descriptor of the file, owned by the reader.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self, offset: int, length: int) -> Any:
        """A copy of ``length`` bytes at ``offset`` (a writable buffer, see
        :func:`new_buffer`), which the caller may keep."""
        out = new_buffer(length)
        with memoryview(out) as view:
            done = 0
            while done < length:
                count = os.preadv(self._fd, [view[done:]], offset + done)
                if count == 0:
                    raise OSError(f"bytes {offset}..{offset + length} lie outside the segment")
                done += count
        return out

    def close(self) -> None:
        """Close the descriptor."""
        os.close(self._fd)

    def __enter__(self) -> FileReader:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Arena:
    """The shared memory of one worker: per slot, a file each way.

    Made with :meth:`create` in the serving process (which sends :attr:`names` to
    the worker) and :meth:`attach` in the worker.
    """

    def __init__(
        self, outgoing: list[Segment], incoming: list[Segment], names: tuple[str, ...]
    ) -> None:
        self._outgoing = outgoing
        self._incoming = incoming
        self.names = names  # the batches' files, then the results', one per slot
        self._unlinker: weakref.finalize[[list[str]], Arena] | None = None

    @classmethod
    def create(cls, slots: int) -> Arena | None:
        """New files for ``slots`` batches, in the serving process; None where there
        is no ``/dev/shm`` or it refuses new files (everything then uses the pipe)."""
        if not SHM_DIR.is_dir():
            return None
        prefix = f"microbatch-{os.getpid()}-"
        names = tuple(prefix + secrets.token_hex(8) for _ in range(2 * slots))
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fds: list[int] = []
        linked: list[str] = []
        try:
            for name in names:
                fds.append(os.open(SHM_DIR / name, flags, 0o600))
                linked.append(name)
                resource_tracker.register(f"/{name}", _TRACKED)
        except OSError:
            for fd in fds:
                os.close(fd)
            _unlink(linked)
            return None
        segments = [Segment(fd) for fd in fds]
        arena = cls(segments[:slots], segments[slots:], names)
        arena._unlinker = weakref.finalize(arena, _unlink, linked)  # if never closed
        return arena

    @classmethod
    def attach(cls, names: Sequence[str]) -> Arena:
        """Open the files the serving process created, in the worker.

        Raises:
            OSError: A file cannot be opened.
        """
        slots = len(names) // 2
        fds = [os.open(SHM_DIR / name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC) for name in names]
        segments = [Segment(fd) for fd in fds]
        return cls(segments[slots:], segments[:slots], tuple(names))

    def outgoing(self, slot: int) -> Segment:
        """The file this process writes the large buffers of slot ``slot`` into."""
        return self._outgoing[slot]

    def incoming(self, slot: int) -> Segment:
        """The file this process reads the large buffers of slot ``slot`` from."""
        return self._incoming[slot]

    def unlink(self) -> None:
        """Remove the names from ``/dev/shm`` (the worker has opened the files, or
        never will); the memory stays while a process holds it open."""
        if self._unlinker is not None:
            self._unlinker()  # runs once: later calls, and exit, do nothing

    def close(self) -> None:
        """Unlink what is still linked, unmap and close every file."""
        self.unlink()
        for segment in (*self._outgoing, *self._incoming):
            segment.close()


def new_buffer(length: int) -> Any:
    """Writable memory for ``length`` bytes: a numpy byte array if this process has
    loaded numpy (not zero-filled, and numpy asks for transparent huge pages for a
    large one: a fraction of the page faults, which dominate copying tens of MiB into
    fresh memory), else a bytearray."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return bytearray(length)
    return numpy.empty(length, numpy.uint8)


def _unlink(names: list[str]) -> None:
    """Unlink ``names`` (gone already is fine) and stop tracking them; empties the list."""
    while names:
        name = names.pop()
        try:
            (SHM_DIR / name).unlink(missing_ok=True)
        finally:
            resource_tracker.unregister(f"/{name}", _TRACKED)
