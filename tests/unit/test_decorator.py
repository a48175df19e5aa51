"""``@microbatch.batch`` on async and sync functions."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import microbatch
from microbatch import AsyncBatchedFunction, SyncBatchedFunction


async def test_async_function_becomes_a_per_item_coroutine_function() -> None:
    sizes: list[int] = []

    @microbatch.batch(max_batch_size=64, max_latency_ms=10)
    async def embed(texts: list[str]) -> list[int]:
        """Length of each text."""
        sizes.append(len(texts))
        return [len(t) for t in texts]

    assert isinstance(embed, AsyncBatchedFunction)
    assert embed.__name__ == "embed" and embed.__doc__ == "Length of each text."
    texts = ["a" * i for i in range(100)]
    assert await asyncio.gather(*(embed(t) for t in texts)) == list(range(100))
    assert sum(sizes) == 100 and max(sizes) <= 64 and len(sizes) < 100
    assert embed.stats().items == 100


def test_bare_decorator_and_asyncio_run_from_sync_code() -> None:
    @microbatch.batch
    async def double(xs: list[int]) -> list[int]:
        return [2 * x for x in xs]

    assert asyncio.run(double(21)) == 42
    assert asyncio.run(double(4)) == 8  # a new loop gets its own batcher


def test_sync_function_serves_many_threads() -> None:
    threads: set[str] = set()

    @microbatch.batch(max_batch_size=8, max_latency_ms=5)
    def score(rows: list[int]) -> list[float]:
        threads.add(threading.current_thread().name)
        time.sleep(0.001)  # a model worth batching
        return [r / 2 for r in rows]

    assert isinstance(score, SyncBatchedFunction)
    with ThreadPoolExecutor(16) as pool:
        assert list(pool.map(score, range(200))) == [r / 2 for r in range(200)]
    assert score.stats().items == 200
    assert score.stats().mean_batch_size > 1
    score.close()


async def test_sync_function_awaited_runs_off_the_loop() -> None:
    loop_thread = threading.current_thread().name
    ran_in: set[str] = set()

    @microbatch.batch(max_batch_size=8, max_latency_ms=1)
    def score(rows: list[int]) -> list[int]:
        ran_in.add(threading.current_thread().name)
        return [r + 1 for r in rows]

    assert await asyncio.gather(*(score.acall(i) for i in range(30))) == list(range(1, 31))
    assert loop_thread not in ran_in


async def test_numpy_rows_callers_send_arrays_of_rows() -> None:
    @microbatch.batch(max_batch_size=8, max_latency_ms=1, rows="numpy")
    async def normalize(rows: np.ndarray) -> np.ndarray:
        assert rows.shape[0] <= 8
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    a = np.array([[3.0, 4.0], [6.0, 8.0]])
    b = np.ones((11, 2))
    out_a, out_b = await asyncio.gather(normalize(a), normalize(b))
    assert out_a.shape == (2, 2) and np.allclose(out_a[0], [0.6, 0.8])
    assert out_b.shape == (11, 2) and np.allclose(out_b, 2**-0.5)


async def test_methods_batch_per_instance() -> None:
    class Model:
        def __init__(self, scale: int) -> None:
            self.scale = scale
            self.batches: list[list[int]] = []

        @microbatch.batch(max_batch_size=16, max_latency_ms=1)
        async def predict(self, xs: list[int]) -> list[int]:
            self.batches.append(list(xs))
            return [x * self.scale for x in xs]

        @microbatch.batch(max_batch_size=16, max_latency_ms=1)
        def score(self, xs: list[int]) -> list[int]:
            return [x + self.scale for x in xs]

    two, three = Model(2), Model(3)
    results = await asyncio.gather(*(m.predict(i) for i in range(20) for m in (two, three)))
    assert results == [i * m for i in range(20) for m in (2, 3)]
    assert sorted(x for batch in two.batches for x in batch) == list(range(20))
    assert sorted(x for batch in three.batches for x in batch) == list(range(20))
    assert two.predict is two.predict  # bound once, kept on the instance
    assert two.predict.stats().items == 20
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(three.score, range(10))) == [x + 3 for x in range(10)]
    assert await three.score.acall(5) == 8
