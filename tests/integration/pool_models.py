"""Models for the pool tests that are ordered by events, not by sleeps: a model tells
the test when it starts a batch and waits for the test's word to finish one."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from microbatch.errors import ItemError
from microbatch.pipeline import Model, WorkerContext


class Gate:
    """Two named pipes between a test and its models: ``started`` (a model writes a
    byte when it starts a batch) and ``go`` (the test writes a byte to let a held
    batch finish). The test holds both ends open, so neither side ever sees an end of
    file and a model's ``open`` never waits.

    Args:
        directory: Where the two pipes are made.
    """

    def __init__(self, directory: Path) -> None:
        self.started_path = str(directory / "started")
        self.go_path = str(directory / "go")
        os.mkfifo(self.started_path)
        os.mkfifo(self.go_path)
        self._started = os.open(self.started_path, os.O_RDWR | os.O_NONBLOCK)
        self._go = os.open(self.go_path, os.O_RDWR)

    @property
    def args(self) -> tuple[str, str]:
        """The model's arguments."""
        return self.started_path, self.go_path

    async def started(self, count: int = 1) -> None:
        """Wait until models have started ``count`` more batches."""
        loop = asyncio.get_running_loop()
        for _ in range(count):
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self._started, ready.set_result, None)
            try:
                await ready
            finally:
                loop.remove_reader(self._started)
            os.read(self._started, 1)

    def release(self, count: int = 1) -> None:
        """Let ``count`` held batches finish."""
        os.write(self._go, b"g" * count)

    def close(self) -> None:
        """Close the test's ends."""
        os.close(self._started)
        os.close(self._go)


class Gated(Model):
    """Says when it starts each batch; holds a batch with a negative item until the
    test says go. Each result tells what the model computed: ``(item, batch)``, the
    batch as the model saw it (for a bytes item: its length); with
    ``result_bytes``, a result is that many bytes instead.
    """

    def __init__(self, started: str, go: str, result_bytes: int = 0) -> None:
        self.paths = (started, go)
        self.result_bytes = result_bytes

    def setup(self, worker: WorkerContext) -> None:
        self.started = os.open(self.paths[0], os.O_WRONLY)
        self.go = os.open(self.paths[1], os.O_RDONLY)

    def predict(self, batch: list[Any]) -> list[Any]:
        os.write(self.started, b"s")
        if any(isinstance(item, int) and item < 0 for item in batch):
            os.read(self.go, 1)
        seen = tuple(item if isinstance(item, int) else len(item) for item in batch)
        if self.result_bytes:
            return [b"r" * self.result_bytes for _ in batch]
        return [(item if isinstance(item, int) else len(item), seen) for item in batch]


class NotAllowed(ItemError):
    """A user's own item error (a subclass)."""


class Strict(Model):
    """Refuses items with an ItemError: returns one for multiples of 3, raises one
    (its own subclass, status 409) for 5, and adds one to the rest."""

    def predict(self, batch: list[int]) -> list[Any]:
        if 5 in batch:
            raise NotAllowed("5 is not allowed here", status=409)
        return [ItemError(f"{x} is a multiple of 3") if x % 3 == 0 else x + 1 for x in batch]


class DropsARow(Model):
    """Returns one result fewer than the rows it was given."""

    def predict(self, batch: list[int]) -> list[int]:
        return batch[:-1]
