"""Models for the contract tests: importable, because workers are spawned."""

from __future__ import annotations

from microbatch.errors import ItemError
from microbatch.pipeline import Model


class RefusesNegatives(Model):
    """Doubles an item; a negative item is refused with a 4xx item error, and 13
    raises one for the whole batch (so bisection must find it)."""

    def predict(self, batch: list[int]) -> list[int | ItemError]:
        if 13 in batch:
            raise ItemError("13 is unlucky", status=400)
        return [ItemError(f"{x} is negative") if x < 0 else 2 * x for x in batch]
