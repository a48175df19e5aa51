"""Ray Serve streams of the simulated step model: ``@serve.batch`` over an async
generator (Ray Serve's streaming batched generator).

``python stream_ray.py PORT``: starts a small local Ray instance (2 CPUs, no
dashboard, the deployment taking no CPU), Ray Serve's HTTP proxy on 127.0.0.1:PORT,
and one deployment whose batched generator yields one list per step (one element
per request; ``StopIteration`` ends a request). A batch runs until its longest item
ends, every step costing the whole batch, and the next batch waits for it
(``max_batch_size=64``, ``batch_wait_timeout_s=0.01``, one batch at a time):
lockstep, as Ray Serve batches streams. SIGTERM shuts Serve and Ray down.

``POST /predict`` with ``{"n": chunks}``: the chunks as lines ``@`` (a streaming
response); ``GET /health``: 200 once the deployment is up.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

sys.path.insert(0, str(Path(__file__).parent))
from stream_models import CHUNK, MAX_ACTIVE, simulate_step


@serve.deployment(max_ongoing_requests=1024, ray_actor_options={"num_cpus": 0})
class Streamer:
    """Lockstep streams behind ``@serve.batch``."""

    @serve.batch(max_batch_size=MAX_ACTIVE, batch_wait_timeout_s=0.01)
    async def steps(self, lengths: list[int]) -> AsyncIterator[list[Any]]:
        for position in range(1, max(lengths) + 1):
            # The step in a thread, as an accelerator would leave the loop free.
            await asyncio.to_thread(simulate_step, len(lengths))
            yield [CHUNK + "\n" if position <= n else StopIteration for n in lengths]

    async def lines(self, length: int) -> AsyncIterator[str]:
        async for line in self.steps(length):
            yield line

    async def __call__(self, request: Request) -> Response:
        if request.url.path.endswith("/health"):
            return PlainTextResponse("ok")
        length = int((await request.json())["n"])
        return StreamingResponse(self.lines(length), media_type="text/plain")


def main(port: int) -> None:
    stop = threading.Event()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # after Ray set its own
    try:
        serve.start(
            http_options={"host": "127.0.0.1", "port": port},
            logging_config={"log_level": "WARNING", "enable_access_log": False},
        )
        serve.run(Streamer.bind(), name="stream", route_prefix="/")
        print(f"ray serve streaming on 127.0.0.1:{port}", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]))
