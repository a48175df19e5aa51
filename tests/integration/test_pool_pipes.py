"""The serving side's pipe ends: the writer and the reader never block the event loop,
keep messages whole and in order, and frame them as multiprocessing's Connection does."""

from __future__ import annotations

import asyncio
import os
import struct
from multiprocessing.connection import Connection

import pytest

from microbatch.pipeline.pipes import MessageReader, PipeWriter
from microbatch.pipeline.transport import encode

_SIZE = struct.Struct("!i")  # Connection's frame length


async def test_messages_larger_than_the_pipe_are_queued_and_arrive_whole_in_order() -> None:
    read_fd, write_fd = os.pipe()
    reader = Connection(read_fd, writable=False)
    writer = PipeWriter(write_fd)
    messages = [b"a" * 10, os.urandom(3 << 20), b"", b"b" * 20_000, os.urandom(1 << 20)]
    ends = [writer.write([message]) for message in messages]  # nobody reads yet
    assert writer.taken < ends[1]  # the pipe took what it holds; the rest waits
    loop = asyncio.get_running_loop()
    received = [await loop.run_in_executor(None, reader.recv_bytes) for _ in messages]
    assert received == messages
    assert writer.taken == ends[-1]
    writer.close()
    assert writer.write([b"after close"]) > writer.taken  # ignored, never taken
    reader.close()
    os.close(write_fd)


async def test_a_reader_that_is_gone_stops_the_writer_quietly() -> None:
    read_fd, write_fd = os.pipe()
    writer = PipeWriter(write_fd)
    assert writer.write([b"taken"]) == writer.taken  # small: straight into the pipe
    os.close(read_fd)
    taken = writer.taken
    end = writer.write([b"lost"])  # EPIPE: the writer closes, raises nothing
    assert end > writer.taken == taken
    assert writer.write([b"later"]) > writer.taken  # ignored
    os.close(write_fd)


def test_the_reader_hands_on_whole_messages_as_their_bytes_arrive() -> None:
    read_fd, write_fd = os.pipe()
    reader = MessageReader(read_fd)
    big = os.urandom(3 << 20)  # an out-of-band frame of its own (no arena)
    wire = b"".join(
        _SIZE.pack(len(frame)) + bytes(frame)
        for message in ({"small": 1}, [big], "last")
        for frame in encode(message, slot=0)
    )
    got: list[object] = []
    with os.fdopen(write_fd, "wb", buffering=0) as pipe:
        for start in range(0, len(wire), 50_000):  # a piece at a time, as a pipe allows
            pipe.write(wire[start : start + 50_000])
            got += [message.decode(None) for message in reader.messages()]  # never blocks
    assert got == [{"small": 1}, [big], "last"]
    with pytest.raises(EOFError):
        reader.messages()
    os.close(read_fd)
