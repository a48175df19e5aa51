"""How often the interpreter hands the GIL from one thread to another while
``microbatch serve`` serves a stage that steps in a thread.

Such a stage (a :class:`~microbatch.StepModel`, or a generator ``predict``, with
``mode="thread"``) runs each step in its worker thread and gets the chunks back on
the event loop's thread. When the step thread wakes (its model let the GIL go: a
sleep, a kernel) while the event loop runs Python (writing the last step's chunks,
reading requests), it waits for the GIL until the loop's thread blocks or Python's
switch interval passes: 5 ms by default, three steps of a 1.6 ms model. While it
serves such a stage the server (under ``--workers``, the hub process, where the
stages run) shortens the interval to :data:`STEP_THREAD_SWITCH_INTERVAL_S`
(``--switch-interval-ms`` sets another), and gives Python's value back when it stops.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator

from ..pipeline.steps import is_step_model

__all__ = [
    "STEP_THREAD_SWITCH_INTERVAL_S",
    "steps_in_thread",
    "switch_interval",
    "switch_interval_for",
]

STEP_THREAD_SWITCH_INTERVAL_S = 0.0005
"""The switch interval while a stage steps in a thread (Python's default: 0.005 s)."""


def steps_in_thread(servables: Iterable[object]) -> bool:
    """Whether a stage of one of ``servables`` (Services; others have no stages) runs
    a step model in a thread."""
    return any(
        stage.mode == "thread" and is_step_model(stage.model)
        for servable in servables
        for stage in getattr(servable, "stages", ())
    )


def switch_interval_for(servables: Iterable[object], asked_s: float | None) -> float | None:
    """The interval to serve with: ``asked_s`` if given, else
    :data:`STEP_THREAD_SWITCH_INTERVAL_S` when a stage steps in a thread, else None
    (Python's own is left as it is)."""
    if asked_s is not None:
        return asked_s
    return STEP_THREAD_SWITCH_INTERVAL_S if steps_in_thread(servables) else None


@contextlib.contextmanager
def switch_interval(seconds: float | None) -> Iterator[None]:
    """Within the block, the interpreter's switch interval is ``seconds`` (None:
    unchanged); the one before is restored after it."""
    if seconds is None:
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
