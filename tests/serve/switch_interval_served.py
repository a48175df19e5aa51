"""Services that report the interpreter's switch interval they run under
(``microbatch serve tests.serve.switch_interval_served:...``)."""

from __future__ import annotations

import sys

from microbatch import Model, Service, Stage, StepModel


class SwitchIntervalSteps(StepModel):
    """Each item streams one chunk: the switch interval its step ran under."""

    def start(self, items: list[int]) -> list[int]:
        return list(items)

    def step(self, states: list[int]) -> tuple[list[float], list[bool]]:
        return [sys.getswitchinterval()] * len(states), [True] * len(states)


class SwitchIntervalBatch(Model):
    """Each item's result: the switch interval its batch ran under."""

    def predict(self, batch: list[int]) -> list[float]:
        return [sys.getswitchinterval()] * len(batch)


steps = Service(Stage(SwitchIntervalSteps, mode="thread", max_batch_size=4), name="steps")
"""A stage that steps in a thread: served with a short switch interval."""

batch = Service(Stage(SwitchIntervalBatch, mode="thread", max_batch_size=4), name="batch")
"""A stage that batches in a thread (no steps): Python's interval is left alone."""
