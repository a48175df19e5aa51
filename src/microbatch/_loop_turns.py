"""What the step loop knows of the event loop's turns: whether one passed while a
step ran (:class:`Turn`), and whether one taken after streams ended brings their
callers back in time for the next step (:class:`Comebacks`)."""

from __future__ import annotations

import asyncio

__all__ = ["Comebacks", "Turn"]

_FIRST_PROBE = 16  # declined turns before one is taken again to measure,
_LAST_PROBE = 1024  # doubling up to this many while nobody comes back in them
_WEIGHT = 0.25  # of the last turn in the running mean of the callers back


class Turn:
    """Whether the event loop turned (ran other callbacks) since this was made."""

    __slots__ = ("_handle", "_turned")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._turned = False
        self._handle = loop.call_soon(self._mark)

    def _mark(self) -> None:
        self._turned = True

    def over(self) -> bool:
        """Whether it turned (asked once)."""
        self._handle.cancel()
        return self._turned


class Comebacks:
    """Whether a turn of the event loop after streams ended brings their callers
    back with new items: a running mean of the new items per ended stream over the
    turns taken. Below one half the turns stop, but for a probe now and then, after
    ``_FIRST_PROBE`` declined chances, then twice as many after each probe that
    found nobody back (up to ``_LAST_PROBE``): a turn nobody uses only keeps the
    model waiting."""

    __slots__ = ("_declined", "_probe_after", "share")

    def __init__(self) -> None:
        self.share = 1.0
        self._declined = 0
        self._probe_after = _FIRST_PROBE

    def worth_a_turn(self) -> bool:
        """Whether to take the turn this time."""
        if self.share >= 0.5:
            return True
        self._declined += 1
        if self._declined < self._probe_after:
            return False
        self._declined = 0
        return True

    def turned(self, new: int, ended: int) -> None:
        """A turn was taken after ``ended`` streams ended; ``new`` items came."""
        was_off = self.share < 0.5
        back = min(1.0, max(0, new) / ended)  # fewer wait after a close: none back
        self.share += _WEIGHT * (back - self.share)
        if self.share >= 0.5:
            self._probe_after = _FIRST_PROBE
        elif was_off:  # a probe that found nobody back
            self._probe_after = min(2 * self._probe_after, _LAST_PROBE)
