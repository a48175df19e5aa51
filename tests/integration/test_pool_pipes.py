"""The serving side's pipe writer: it never blocks the event loop, keeps messages in
order, and frames them as multiprocessing's Connection reads them."""

from __future__ import annotations

import asyncio
import os
from multiprocessing.connection import Connection

from microbatch.pipeline.writer import PipeWriter


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
