"""The thread batcher's asyncio callers, told their results: the calls settled under
the batcher's lock are gathered, then answered in their own event loops, one callback
per loop (not one wake-up of a loop per item)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from ._calls import LoopCall

__all__ = ["LoopAnswers"]


class LoopAnswers:
    """Asyncio callers whose items are all settled, not yet told.

    Args:
        result: A caller's result from its items' outcomes (several parts with
            ``rows``); it raises what the caller should get.
    """

    __slots__ = ("_result", "_settled")

    def __init__(self, result: Callable[[list[Any]], Any]) -> None:
        self._result = result
        self._settled: list[LoopCall] = []

    def add(self, call: LoopCall) -> None:
        """A call whose items are all settled (batcher lock held); once per call."""
        if not call.answered:
            call.answered = True
            self._settled.append(call)

    def send(self) -> None:
        """Answer the calls gathered, in their loops (batcher lock held)."""
        if not self._settled:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[LoopCall]] = {}
        for call in self._settled:
            by_loop.setdefault(call.loop, []).append(call)
        self._settled = []
        for loop, calls in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
                loop.call_soon_threadsafe(self._answer, calls)

    def _answer(self, calls: list[LoopCall]) -> None:
        """In the callers' loop: each one's result, from its settled items."""
        for call in calls:
            if call.future.done():
                continue
            entries = call.entries
            if len(entries) == 1 and not isinstance(entries[0].outcome, BaseException):
                call.future.set_result(entries[0].outcome)
                continue
            try:
                result = self._result([entry.outcome for entry in entries])
            except BaseException as exc:
                call.future.set_exception(exc)
            else:
                call.future.set_result(result)
