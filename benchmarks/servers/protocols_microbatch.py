"""microbatch for the protocols benchmark: the simulated accelerator as a typed Service.

``{"x": float}`` -> ``{"y": 2x}`` in a worker process, ``time.sleep(0.002 + 0.00002 * n)``
per batch of n, max batch 64, ``max_latency_ms=10``: the same model over ``/predict``,
v2 REST (input ``x`` FP32 ``[-1, 1]``, output ``y``) and v2 gRPC. Run, from this
directory: ``microbatch serve protocols_microbatch:service --grpc-port 0``.
"""

from __future__ import annotations

import time

import msgspec

import microbatch


class X(msgspec.Struct):
    """One item."""

    x: float


class Y(msgspec.Struct):
    """Its result."""

    y: float


class Simulated(microbatch.Model):
    """A simulated accelerator: 2 ms per batch plus 20 us per item."""

    def predict(self, batch: list[X]) -> list[Y]:
        time.sleep(0.002 + 0.00002 * len(batch))
        return [Y(2 * item.x) for item in batch]


service = microbatch.Service(
    microbatch.Stage(
        Simulated,
        name="sim",
        workers=1,
        batching=microbatch.BatchConfig(max_batch_size=64, max_latency_ms=10),
    )
)
