"""Models of the timing and tracing tests beyond ``tests/http/models.py``."""

from __future__ import annotations

import os
import socket
import time

import microbatch
from microbatch import ItemError, Model, Service, Stage
from tests.http.models import Double, Doubled, Point


@microbatch.batch(max_batch_size=32, max_latency_ms=2)
def triple(points: list[Point]) -> list[Doubled]:
    """A plain (thread-batched) function: its batches run off the event loop."""
    return [Doubled(3 * point.x) for point in points]


class Slow(Model):
    """Doubles after 0.5 s, one item per batch, one queued at most: a second request
    waits, a third is refused (``Overloaded``). Each batch, as it starts, connects
    to the Unix socket named by ``SLOW_STARTED`` (when set): the test listening
    there knows that it runs."""

    def predict(self, batch: list[Point]) -> list[Doubled]:
        started = os.environ.get("SLOW_STARTED")
        if started:
            with socket.socket(socket.AF_UNIX) as tell:
                tell.connect(started)
        time.sleep(0.5)
        return [Doubled(2 * point.x) for point in batch]


slow = Service(Stage(Slow, mode="thread", max_batch_size=1, max_latency_ms=0, max_queue=1))


class Picky(Model):
    """The second stage of :func:`make_picky`: refuses a negative ``y``."""

    def predict(self, batch: list[Doubled]) -> list[Doubled | ItemError]:
        return [ItemError("y < 0") if item.y < 0 else item for item in batch]


def make_picky() -> Service:
    """``Double`` then ``Picky``: a negative ``x`` fails in the second stage."""
    return Service(Stage(Double, mode="thread"), Stage(Picky, mode="thread"))
