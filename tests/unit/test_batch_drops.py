"""A drop told to a worker names positions in the batch as it was last sent: a batch
sent again (its worker died) before a pending drop went out must not have other
items dropped by it."""

from __future__ import annotations

import asyncio
from typing import Any

from microbatch.pipeline.batches import Batch, prepare, unwanted
from microbatch.types import BatchJob


class _Writer:
    def __init__(self) -> None:
        self.frames: list[Any] = []

    def write(self, frames: Any) -> None:
        self.frames.append(frames)


class _Worker:
    """A worker holding a running batch, then ``batch`` behind it."""

    def __init__(self, batch: Batch) -> None:
        self.alive = True
        self.writer = _Writer()
        running = Batch(BatchJob([0], [None], lambda i: True, 1), asyncio.Future(), False)
        self.batches = {9: running, batch.slot: batch}


async def test_a_drop_pending_when_its_batch_is_sent_again_is_not_told() -> None:
    gone: set[int] = set()
    job = BatchJob(list(range(4)), [None] * 4, lambda i: i not in gone, 4)
    batch = Batch(job, asyncio.get_running_loop().create_future(), True)
    assert prepare(batch, 0, None) is not None and batch.sent == [0, 1, 2, 3]
    batch.slot = 0
    first = batch.worker = _Worker(batch)
    gone.add(1)
    unwanted(batch, 1)  # position 1 of that sending, told at the end of this turn
    # Its worker dies before the drop goes out; the batch is sent again elsewhere.
    assert prepare(batch, 0, None) is not None and batch.sent == [0, 2, 3]
    batch.worker = second = _Worker(batch)
    await asyncio.sleep(0)
    assert first.writer.frames == second.writer.frames == []  # item 2 keeps its place


async def test_a_drop_for_a_waiting_batch_names_its_position() -> None:
    gone: set[int] = set()
    job = BatchJob(list(range(4)), [None] * 4, lambda i: i not in gone, 4)
    batch = Batch(job, asyncio.get_running_loop().create_future(), False)
    prepare(batch, 0, None)
    batch.slot = 0
    worker = batch.worker = _Worker(batch)
    gone.update({0, 3})
    unwanted(batch, 0)
    unwanted(batch, 3)
    await asyncio.sleep(0)
    assert len(worker.writer.frames) == 1  # one drop for both, told once
    assert batch.dropping == []
