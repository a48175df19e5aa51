"""One stream on its own: chunks in order, one end, the error raised once, its two
deadlines on a fake clock, and leaving (by aclose, by being dropped)."""

from __future__ import annotations

import asyncio

import pytest

from microbatch.errors import DeadlineExceeded, ItemError
from microbatch.streams import Channel, Stream, stop_reading
from microbatch.testing import FakeClock


def channel(clock: FakeClock, **deadlines: float | None) -> tuple[Channel, list[Channel]]:
    ends: list[Channel] = []
    made = Channel(
        0,
        "item",
        deadline=deadlines.get("deadline"),
        first_chunk_deadline=deadlines.get("first"),
        clock=clock,
        on_end=ends.append,
    )
    return made, ends


async def test_chunks_then_one_end() -> None:
    source, ends = channel(FakeClock())
    stream = Stream(source)
    source.push(1)
    source.push(2)
    source.push(3)
    assert await stream.__anext__() == 1
    assert stream.take_ready() == [2, 3]
    source.finish()
    source.finish(ItemError("too late: ended already"))
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert ends == [source] and source.error is None


async def test_the_error_is_raised_once_after_the_chunks() -> None:
    source, _ = channel(FakeClock())
    stream = Stream(source)
    source.push("a")
    source.finish(ItemError("bad"))
    assert [chunk async for chunk in _until_error(stream)] == ["a"]
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def _until_error(stream: Stream):  # type: ignore[no-untyped-def]
    with pytest.raises(ItemError, match="bad"):
        async for chunk in stream:
            yield chunk


async def test_the_first_chunk_deadline_then_the_whole_stream_deadline() -> None:
    clock = FakeClock()
    early, _ = channel(clock, first=1.0, deadline=5.0)
    late, _ = channel(clock, first=1.0, deadline=5.0)
    late.push("in time")
    clock.advance(1.0)
    assert isinstance(early.error, DeadlineExceeded) and "no chunk" in str(early.error)
    assert not late.ended
    clock.advance(4.0)
    assert isinstance(late.error, DeadlineExceeded) and "did not end" in str(late.error)
    assert clock.pending_timers() == 0


async def test_leaving_by_aclose_or_by_dropping_the_stream() -> None:
    clock = FakeClock()
    closed, ends = channel(clock, deadline=3.0)
    await Stream(closed).aclose()
    assert closed.left and ends == [closed] and clock.pending_timers() == 0
    dropped, ends = channel(clock)
    Stream(dropped)  # nobody holds it
    assert dropped.left and ends == [dropped]


async def test_stop_reading_leaves_a_stream_and_lets_any_other_iterator_be() -> None:
    source, ends = channel(FakeClock())
    stream = Stream(source)
    await stop_reading(stream)
    assert source.left and ends == [source]

    class Plain:  # an async iterator that cannot be closed
        def __aiter__(self) -> Plain:
            return self

        async def __anext__(self) -> int:
            return 1

    plain = Plain()
    await stop_reading(plain)
    assert await plain.__anext__() == 1


async def test_a_writer_that_takes_the_chunks_is_called_instead_of_the_reader_woken() -> None:
    source, _ = channel(FakeClock())
    stream = Stream(source)
    came: list[int] = []
    stream.on_chunk(lambda: came.append(len(source.chunks)))
    reader = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)
    source.push(1)
    source.push(2)
    await asyncio.sleep(0)
    assert came == [1, 2] and not reader.done()
    taken = stream.take_ready()
    assert taken == [1, 2]
    stream.unread(taken)  # could not write them: back to the reader, first
    assert await asyncio.wait_for(reader, 5) == 1
    stream.on_chunk(None)
    source.push(3)
    assert stream.take_ready() == [2, 3] and came == [1, 2]


async def test_the_end_wakes_the_reader_while_a_writer_takes_the_chunks() -> None:
    source, _ = channel(FakeClock())
    stream = Stream(source)
    stream.on_chunk(lambda: None)
    reader = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)
    source.finish()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(reader, 5)
