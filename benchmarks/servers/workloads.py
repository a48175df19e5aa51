"""The two HTTP workloads, shared by every contender's server file.

Kept free of any server framework (and of microbatch) so that each contender's
virtualenv can import it. The workload is chosen by ``BENCH_WORKLOAD``:

* ``sim``: a simulated accelerator, ``time.sleep(0.002 + 0.00002 * n)`` per batch of
  n; ``{"x": float}`` -> ``{"y": 2 * x}``.
* ``numpy``: one 256x256 float32 layer per batch (matmul, then relu);
  ``{"x": [256 floats]}`` -> ``{"y": [256 floats]}``. BLAS threads are pinned to 1
  by the harness (``OPENBLAS_NUM_THREADS`` and friends).

Every batch is counted into ``BENCH_COUNTER_FILE`` (see ``counter.py``), which the
harness reads before and after a run to get the mean batch size.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from counter import BatchCounter, read_counter

__all__ = ["MAX_BATCH", "MAX_WAIT_MS", "Workload", "load", "read_counter"]

MAX_BATCH = 64
MAX_WAIT_MS = 10.0
WIDTH = 256


class Workload:
    """One workload: ``predict(list of bodies) -> list of replies``, counted per batch."""

    def __init__(self, name: str, counter_path: str | None) -> None:
        self.name = name
        self._counter = BatchCounter(counter_path)
        self._run: Callable[[list[Any]], list[Any]] = {"sim": _simulated, "numpy": _layer()}[name]

    def predict(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run one batch of request bodies; return one reply body per request."""
        self._counter.add(len(bodies))
        return [{"y": y} for y in self._run([body["x"] for body in bodies])]


def _simulated(xs: list[float]) -> list[float]:
    time.sleep(0.002 + 0.00002 * len(xs))
    return [2 * x for x in xs]


def _layer() -> Callable[[list[Any]], list[Any]]:
    import numpy as np

    weights = np.random.default_rng(0).standard_normal((WIDTH, WIDTH), dtype=np.float32) / 16

    def run(xs: list[list[float]]) -> list[list[float]]:
        batch = np.asarray(xs, dtype=np.float32)
        return np.maximum(batch @ weights, 0.0).tolist()  # type: ignore[no-any-return]

    return run


def load() -> Workload:
    """The workload named by the environment (``BENCH_WORKLOAD``, default ``sim``)."""
    return Workload(os.environ.get("BENCH_WORKLOAD", "sim"), os.environ.get("BENCH_COUNTER_FILE"))
