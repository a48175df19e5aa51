"""A small two-stage service for the ``microbatch tune`` tests (importable by target)."""

from __future__ import annotations

import numpy as np

from microbatch import BatchConfig, Service, Stage
from microbatch.pipeline import Model, WorkerContext


class Vectorize(Model):
    """Text to a fixed-length vector of character codes."""

    def predict(self, batch: list[str]) -> list[np.ndarray]:
        return [np.resize(np.frombuffer(t.encode(), dtype=np.uint8), 64) / 255.0 for t in batch]


class Project(Model):
    """One matrix product per batch: 64 -> 16 features."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def setup(self, worker: WorkerContext) -> None:
        self.weights = np.random.default_rng(self.seed).standard_normal((64, 16))

    def predict(self, batch: list[np.ndarray]) -> list[list[float]]:
        return (np.stack(batch) @ self.weights).tolist()  # type: ignore[no-any-return]


service = Service(
    Stage(Vectorize, workers=2, batching=BatchConfig(max_batch_size=32)),
    Stage(Project, batching=BatchConfig(max_batch_size=8), kwargs={"seed": 3}),
    examples=["hello", "a longer example text"],
)

no_examples = Service(Stage(Vectorize))
not_a_service = "just a string"
