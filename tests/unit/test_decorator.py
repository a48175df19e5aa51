"""``@microbatch.batch`` on async and sync functions."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import microbatch
from microbatch import AdaptivePolicy, AsyncBatchedFunction, DeadlineExceeded, SyncBatchedFunction
from microbatch.stats import ServiceStats
from microbatch.types import Servable


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
    assert embed.stats().stages[0].batching.items == 100


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
    assert score.stats().stages[0].batching.items == 200
    assert score.stats().stages[0].batching.mean_batch_size > 1
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
    assert two.predict.stats().stages[0].batching.items == 20
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(three.score, range(10))) == [x + 3 for x in range(10)]
    assert await three.score.acall(5) == 8


async def test_batched_functions_are_servable() -> None:
    @microbatch.batch(max_batch_size=4, examples=["hello"])
    async def lengths(texts: list[str]) -> list[int]:
        return [len(t) for t in texts]

    @microbatch.batch(max_batch_size=4, max_concurrent_batches=2)
    def doubles(xs: list[int]) -> list[int]:
        return [2 * x for x in xs]

    for function in (lengths, doubles):
        servable: Servable[Any, Any] = function
        assert servable.routes == {} and not servable.ready
        await servable.start()
        assert servable.ready
        with pytest.raises(KeyError):
            await servable.submit("x", route="other")
    assert (lengths.name, lengths.input_type, lengths.output_type) == ("lengths", str, int)
    assert lengths.examples == ("hello",) and doubles.examples == ()
    assert await lengths.submit("four", deadline=time.monotonic() + 10) == 4
    assert await doubles.submit(21) == 42
    stats = doubles.stats()
    assert isinstance(stats, ServiceStats) and stats.ready and not stats.draining
    (stage,) = stats.stages
    assert (stage.name, stage.workers, stage.batching.items) == ("doubles", 2, 1)
    await lengths.close()
    await doubles.close()
    assert not lengths.ready and doubles.stats().draining
    with pytest.raises(DeadlineExceeded):  # a deadline given to submit is final
        await doubles.submit(1, deadline=time.monotonic() - 1)


async def test_a_sync_function_has_one_queue_and_one_set_of_counters() -> None:
    @microbatch.batch(max_batch_size=64, max_latency_ms=1)
    def double(xs: list[int]) -> list[int]:
        return [2 * x for x in xs]

    with ThreadPoolExecutor(4) as pool:
        threaded = [asyncio.wrap_future(pool.submit(double, i)) for i in range(20)]
        awaited = [double.acall(i) for i in range(20, 40)]
        results = await asyncio.gather(*threaded, *awaited)
    assert results == [2 * i for i in range(40)]
    assert double.stats().stages[0].batching.items == 40  # acall traffic included
    assert double.batcher is double.loop_batcher is double.threads
    await double.close()


def test_a_policy_given_to_batch_is_a_prototype_never_shared() -> None:
    prototype = AdaptivePolicy(8, 0.005)

    class Model:
        @microbatch.batch(policy=prototype)
        def score(self, xs: list[int]) -> list[int]:
            return xs

        @microbatch.batch(policy=prototype)
        async def predict(self, xs: list[int]) -> list[int]:
            return xs

    one, two = Model(), Model()
    policies = [one.score.batcher.policy, two.score.batcher.policy]
    policies += [asyncio.run(_policy_of(m.predict)) for m in (one, two)]
    assert len({id(policy) for policy in policies}) == 4 and prototype not in policies
    assert one.score(3) == 3 and two.score(4) == 4
    assert prototype.cost.samples == 0  # nothing learned into the prototype


async def _policy_of(function: AsyncBatchedFunction[int, int]) -> object:
    return function.batcher.policy
