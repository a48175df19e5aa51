"""The two HTTP workloads, shared by every contender's server file.

Kept free of any server framework (and of microbatch) so that each contender's
virtualenv can import it. The workload is chosen by ``BENCH_WORKLOAD``:

* ``sim``: a simulated accelerator, ``time.sleep(0.002 + 0.00002 * n)`` per batch of
  n; ``{"x": float}`` -> ``{"y": 2 * x}``.
* ``numpy``: one 256x256 float32 layer per batch (matmul, then relu);
  ``{"x": [256 floats]}`` -> ``{"y": [256 floats]}``. BLAS threads are pinned to 1
  by the harness (``OPENBLAS_NUM_THREADS`` and friends).
* ``scalar``: *scalar numpy* (issue 15): ``{"x": float}`` -> ``{"y": float}``; each x
  is expanded to a 256-float vector (x times a fixed ramp), one ``(n x 256) @
  (256 x 256)`` float32 layer runs per batch (then relu), and y is the sum of its
  row. Small requests, real model work: this measures the HTTP front. Its wait is
  5 ms (the others' 10 ms).

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
WIDTH = 256
WAIT_MS = {"sim": 10.0, "numpy": 10.0, "scalar": 5.0}
"""Each workload's longest wait for a batch to fill."""
MAX_WAIT_MS = WAIT_MS.get(os.environ.get("BENCH_WORKLOAD", "sim"), 10.0)
"""The wait of the workload this process serves (servers read it at import)."""


class Workload:
    """One workload: ``predict(list of bodies) -> list of replies``, counted per batch."""

    def __init__(self, name: str, counter_path: str | None) -> None:
        self.name = name
        self._counter = BatchCounter(counter_path)
        runs = {"sim": lambda: _simulated, "numpy": _layer, "scalar": _scalar_layer}
        self._run: Callable[[list[Any]], list[Any]] = runs[name]()

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


def _scalar_layer() -> Callable[[list[Any]], list[Any]]:
    import numpy as np

    weights = np.random.default_rng(0).standard_normal((WIDTH, WIDTH), dtype=np.float32) / 16
    ramp = np.linspace(-1.0, 1.0, WIDTH, dtype=np.float32)

    def run(xs: list[float]) -> list[float]:
        batch = np.asarray(xs, dtype=np.float32)[:, None] * ramp
        return np.maximum(batch @ weights, 0.0).sum(axis=1).tolist()  # type: ignore[no-any-return]

    return run


def load() -> Workload:
    """The workload named by the environment (``BENCH_WORKLOAD``, default ``sim``)."""
    return Workload(os.environ.get("BENCH_WORKLOAD", "sim"), os.environ.get("BENCH_COUNTER_FILE"))
