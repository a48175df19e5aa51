"""A model for the out-of-memory tests: it raises MemoryError when a batch's total
cost (the sum of its items) is above a limit the batcher is not told."""

from __future__ import annotations

from microbatch.pipeline import Model


class RunsOutAbove(Model):
    """Doubles each item; a batch whose items sum to more than ``limit`` raises
    MemoryError, as a model on a full device would."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def predict(self, batch: list[int]) -> list[int]:
        """Each item doubled, or MemoryError for a batch over the limit."""
        if len(batch) > 1 and sum(batch) > self.limit:
            raise MemoryError(f"a batch of cost {sum(batch)} does not fit in {self.limit}")
        return [item * 2 for item in batch]
