"""Measuring a service's models in this process, stage after stage, for ``tune``."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..loading import load_target
from ..pipeline import Model, Service, Stage, WorkerContext
from .advice import Measurement, StageCurve

__all__ = [
    "TuneError",
    "batch_sizes",
    "load_service",
    "measure_model",
    "measure_service",
    "measure_serving",
]

Timer = Callable[[], float]


class TuneError(Exception):
    """The service cannot be measured (bad target, no examples, a failing model)."""


def load_service(target: str) -> Service[Any, Any]:
    """Import ``MODULE:ATTR`` (the current directory is searched first) and return it.

    Raises:
        TuneError: The target is malformed, cannot be imported, or is not a Service.
    """
    try:
        service = load_target(target)
    except (ValueError, ImportError, AttributeError) as exc:
        reason = "cannot import" if isinstance(exc, ImportError) else "cannot load"
        raise TuneError(f"{reason} {target!r}: {exc}") from exc
    if not isinstance(service, Service):
        raise TuneError(f"{target} is {type(service).__name__}, not a microbatch.Service")
    return service


def batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to ``max_batch``, which is included even if not a power of two."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
    return sizes if sizes[-1] == max_batch else [*sizes, max_batch]


def measure_model(
    model: Model,
    examples: Sequence[Any],
    sizes: Sequence[int],
    *,
    repeats: int = 5,
    warmup: int = 1,
    timer: Timer = time.perf_counter,
) -> tuple[list[Measurement], int | None]:
    """Time ``model.predict`` on the examples repeated to each batch size.

    Each size runs ``warmup`` times unmeasured, then ``repeats`` times measured; its
    time is the median. Sizes stop at the first that runs out of memory
    (``MemoryError``, or an error whose message says "out of memory", like CUDA's).

    Returns:
        The measurements, and the batch size that ran out of memory (or ``None``).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats!r}, {warmup!r}")
    points: list[Measurement] = []
    for size in sizes:
        batch = [examples[i % len(examples)] for i in range(size)]
        times: list[float] = []
        try:
            for _ in range(warmup):
                model.predict(batch)
            for _ in range(repeats):
                start = timer()
                model.predict(batch)
                times.append(timer() - start)
        except Exception as exc:
            if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
                gc.collect()
                return points, size
            raise
        points.append(Measurement(size, max(statistics.median(times), 1e-9)))
    return points, None


def measure_service(
    service: Service[Any, Any],
    *,
    max_batch: int = 64,
    repeats: int = 5,
    warmup: int = 1,
    timer: Timer = time.perf_counter,
    progress: Callable[[str], None] = lambda line: None,
) -> list[StageCurve]:
    """Build each stage's model here, set it up and measure it on the warm-up examples.

    Stage k + 1 is fed what stage k returned for the examples. One model is in
    memory at a time; each stage's ``env`` is set while its model is built and run.

    Raises:
        TuneError: The service has no examples, or a model failed on them.
    """
    if not service.examples:
        raise TuneError("the service has no warm-up examples: tune runs the models on them")
    sizes = batch_sizes(max_batch)
    items = list(service.examples)
    curves = []
    for stage in service.stages:
        progress(f"stage {stage.name}: setting up")
        with _environment(_worker_env(stage)):
            model = _build(stage)
            outputs = _run_examples(stage, model, items)
            progress(f"stage {stage.name}: timing batches of {', '.join(map(str, sizes))}")
            points, memory_limit = measure_model(
                model, items, sizes, repeats=repeats, warmup=warmup, timer=timer
            )
        if not points:
            raise TuneError(f"stage {stage.name!r} ran out of memory on a batch of one")
        curve = StageCurve(
            stage.name, stage.workers, tuple(points), memory_limit, _cost_per_item(stage, items)
        )
        curves.append(curve)
        del model
        gc.collect()
        items = outputs
    return curves


def _cost_per_item(stage: Stage, items: list[Any]) -> float | None:
    """An example's cost as the stage's batches count it: the largest for padded
    batches, the mean for summed ones; None without a ``cost_fn``."""
    config = stage.config
    if config.cost_fn is None:
        return None
    costs = [float(config.cost_fn(item)) for item in items]
    return max(costs) if config.batch_cost == "padded" else statistics.fmean(costs)


async def measure_serving(
    service: Service[Any, Any], *, requests: int = 2000, concurrency: int = 64
) -> float:
    """Requests per second the serving path alone handles: the HTTP app (read,
    decode, queue, batch, encode) over a model that answers at once, driven
    in-process through ASGI with the service's examples as JSON bodies. The
    connection layer (sockets, HTTP parsing) is not included.

    Raises:
        TuneError: An example was not answered 200.
    """
    import msgspec

    from ..decorator import batch
    from ..http import app as http_app

    @batch(max_batch_size=64, max_latency_ms=1)
    def echo(items: list[Any]) -> list[Any]:
        return items

    asgi = http_app(echo)
    failed: list[int] = []
    bodies = [msgspec.json.encode(example) for example in service.examples]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "path": "/predict",
        "raw_path": b"/predict",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }

    async def one(index: int) -> None:
        body = bodies[index % len(bodies)]
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.Event().wait()  # the client stays connected
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] != 200:
                failed.append(message["status"])

        await asgi(scope, receive, send)

    async def worker(start: int) -> None:
        for index in range(start, requests, concurrency):
            await one(index)

    await echo.start()
    try:
        began = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - began
    finally:
        await echo.close()
    if failed:
        raise TuneError(f"the serving path answered {failed[0]} to an example")
    return requests / elapsed


def _build(stage: Stage) -> Model:
    try:
        model = stage.model(*stage.args, **stage.kwargs)
        model.setup(WorkerContext(stage.name, 0))
    except Exception as exc:
        raise TuneError(f"stage {stage.name!r}: setup failed: {exc!r}") from exc
    return model


def _run_examples(stage: Stage, model: Model, items: list[Any]) -> list[Any]:
    try:
        outputs = list(model.predict(items))
    except Exception as exc:
        raise TuneError(f"stage {stage.name!r} failed on the examples: {exc!r}") from exc
    if len(outputs) != len(items):
        raise TuneError(
            f"stage {stage.name!r} returned {len(outputs)} results for {len(items)} examples"
        )
    for i, output in enumerate(outputs):
        if isinstance(output, BaseException):
            raise TuneError(f"stage {stage.name!r} failed on example {i}: {output!r}")
    return outputs


def _worker_env(stage: Stage) -> Mapping[str, str]:
    """The environment of the stage's first worker (``env`` may be a function of the
    worker index)."""
    env: Any = stage.env
    return dict(env(0) if callable(env) else env)


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
