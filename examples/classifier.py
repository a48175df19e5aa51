"""A small, fast scikit-learn model: iris species from four flower measurements.

The classifier is trained at worker start-up on the iris data set that ships with
scikit-learn (150 flowers), so it needs no file and no download. A request whose
measurements are not finite fails alone: its batch neighbours still get answers.

Run in-process::

    async with service:
        answer = await service.submit(IrisRequest(5.1, 3.5, 1.4, 0.2))  # setosa
"""

from __future__ import annotations

import math

import msgspec
import numpy as np

import microbatch

__all__ = ["IrisClassifier", "IrisPrediction", "IrisRequest", "make_service", "service"]


class IrisRequest(msgspec.Struct, frozen=True):
    """One flower's measurements, in centimetres."""

    sepal_length: float
    sepal_width: float
    petal_length: float
    petal_width: float


class IrisPrediction(msgspec.Struct, frozen=True):
    """The most likely species and the model's probability for it."""

    species: str
    probability: float


class IrisClassifier(microbatch.Model):
    """Logistic regression over the four measurements, one matrix product per batch."""

    def setup(self, worker: microbatch.WorkerContext) -> None:
        """Train on the bundled iris data (deterministic: lbfgs, no randomness)."""
        from sklearn.datasets import load_iris
        from sklearn.linear_model import LogisticRegression

        iris = load_iris()
        self.species = [str(name) for name in iris.target_names]
        self.model = LogisticRegression(max_iter=1000).fit(iris.data, iris.target)

    def predict(self, batch: list[IrisRequest]) -> list[IrisPrediction | ValueError]:
        """Classify a batch; a request with a non-finite measurement fails alone."""
        rows = [(r.sepal_length, r.sepal_width, r.petal_length, r.petal_width) for r in batch]
        valid = [i for i, row in enumerate(rows) if all(math.isfinite(v) for v in row)]
        out: list[IrisPrediction | ValueError] = [
            ValueError(f"measurements must be finite numbers, got {rows[i]}")
            for i in range(len(batch))
        ]
        if valid:
            probabilities = self.model.predict_proba(np.array([rows[i] for i in valid]))
            for i, p in zip(valid, probabilities, strict=True):
                best = int(p.argmax())
                out[i] = IrisPrediction(self.species[best], float(p[best]))
        return out


def make_service() -> microbatch.Service:
    """A new, unstarted service (a Service runs once: start, serve, close)."""
    return microbatch.Service(
        microbatch.Stage(
            IrisClassifier,
            workers=1,
            batching=microbatch.BatchConfig(max_batch_size=256, max_latency_ms=5),
        ),
        examples=[
            IrisRequest(5.1, 3.5, 1.4, 0.2),
            IrisRequest(5.7, 2.8, 4.1, 1.3),
            IrisRequest(6.5, 3.0, 5.8, 2.2),
        ],
    )


service = make_service()
