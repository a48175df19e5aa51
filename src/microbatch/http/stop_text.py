"""Text cut before its first stop sequence, as it comes in pieces.

A stop sequence may be split across pieces (``"Hel"``, ``"lo"`` for the stop
``"ell"``), so the end of the text that could still grow into a stop sequence is
held back until the next piece says whether it does: nothing that turns out to lie
at or after the first stop sequence is ever let through.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopText"]


class StopText:
    """Lets a text through piece by piece, up to (not including) the first of
    ``stops`` to be complete (the one that ends first, as the text is made).

    Args:
        stops: The stop sequences (empty ones are ignored).
    """

    __slots__ = ("_held", "_longest", "_stops", "stopped")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._longest = max(map(len, self._stops), default=0)
        self._held = ""
        self.stopped = False
        """A stop sequence has come: nothing more is let through."""

    def feed(self, piece: str) -> str:
        """The text that can be sent now that ``piece`` has come: all of it but
        what may begin a stop sequence, or, once one has come, the text before it."""
        if self.stopped:
            return ""
        if not self._stops:
            return piece
        text = self._held + piece
        # The stop that is complete first wins (the earliest end; of two ending
        # together, the longer): a model's text comes in order, so a longer stop
        # that began before it would only have been complete later.
        found = [(at + len(stop), at) for stop in self._stops if (at := text.find(stop)) >= 0]
        if found:
            self.stopped = True
            self._held = ""
            return text[: min(found)[1]]
        keep = self._unfinished_stop(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The text held back, once the text has ended without a stop sequence."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _unfinished_stop(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins a stop sequence."""
        for length in range(min(len(text), self._longest - 1), 0, -1):
            end = text[len(text) - length :]
            if any(stop.startswith(end) for stop in self._stops):
                return length
        return 0
