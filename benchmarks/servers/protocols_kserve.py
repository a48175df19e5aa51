"""KServe's ``ModelServer`` for the protocols benchmark, in its own virtualenv.

``python protocols_kserve.py --http_port P --grpc_port G`` (KServe reads its own
flags). ``BENCH_WORKLOAD=sim``: model ``sim``, v2 input ``x`` FP32 -> output ``y``
(``2x``), one simulated accelerator (an asyncio lock around a 2 ms + 20 us/row sleep:
the event loop stays free, as kind to KServe as it can be). ``BENCH_WORKLOAD=embed``:
model ``embed``, v2 input ``text`` BYTES -> output ``embedding`` FP32 ``[n, 384]``,
all-MiniLM-L6-v2 on the CPU (``embedding.py``, as every peer gets it). KServe has no
batcher for v2: each request runs alone. One uvicorn worker.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

sys.path.insert(0, str(Path(__file__).parent))


class Simulated(Model):
    """The simulated accelerator, one batch (one request's rows) at a time."""

    def __init__(self) -> None:
        super().__init__("sim")
        self.device = asyncio.Lock()
        self.ready = True

    async def predict(
        self, payload: InferRequest, headers: Any = None, response_headers: Any = None
    ) -> InferResponse:
        x = payload.inputs[0].as_numpy().astype(np.float32)
        async with self.device:
            await asyncio.sleep(0.002 + 0.00002 * len(x))
        output = InferOutput("y", list(x.shape), "FP32")
        output.set_data_from_numpy(2 * x, binary_data=False)
        return InferResponse(payload.id or "", self.name, [output])


class Embed(Model):
    """all-MiniLM-L6-v2, one request's texts per forward pass."""

    def __init__(self) -> None:
        super().__init__("embed")
        from embedding import Embedder

        self.embedder = Embedder()
        self.ready = True

    def predict(
        self, payload: InferRequest, headers: Any = None, response_headers: Any = None
    ) -> InferResponse:
        texts = [
            value.decode() if isinstance(value, bytes) else str(value)
            for value in payload.inputs[0].as_numpy().reshape(-1)
        ]
        vectors = np.asarray(self.embedder.embed(texts), dtype=np.float32)
        output = InferOutput("embedding", list(vectors.shape), "FP32")
        output.set_data_from_numpy(vectors, binary_data=False)
        return InferResponse(payload.id or "", self.name, [output])


if __name__ == "__main__":
    model = Embed() if os.environ.get("BENCH_WORKLOAD") == "embed" else Simulated()
    ModelServer(workers=1, enable_latency_logging=False).start([model])
