"""Whether the event loop's thread hands the GIL to a model's thread with each call
(:class:`GilHandoff`), learned from the calls' round trips.

A model thread woken by a call needs the GIL before it runs a line of the model.
Without a hand-over it waits until the event loop's thread blocks, or until the
interpreter's switch interval has passed (5 ms by default): and right after handing
a step over, the loop writes or hands out the last step's chunks, so the step starts
that much later (about 0.5 ms a step under ``microbatch serve``, whose interval is
0.5 ms). With a hand-over the loop's thread waits, the GIL free, until the model's
thread has taken the call, and the step starts at once.

That pays when the model then lets the GIL go for long (it sleeps, waits for a
device, or runs one large native call): the loop's work overlaps the step. It costs
when the model takes the GIL back between many short native calls while the loop's
thread is busy: the step then stalls at each of them. Which one holds depends on the
model and on the load, so both are measured, as the time from a call to its answer
in the loop. Calls go one way (at first without a hand-over, Python's own way); now
and then ``PROBE_CALLS`` calls in a row go the other way, and if they were answered
at least ``MARGIN`` sooner on average than the running mean of the way in use, the
other way is used from then on. Probes come after ``FIRST_PROBE`` calls, then after
twice as many each time the way in use stays, up to ``LAST_PROBE``; a switch starts
the count again from ``FIRST_PROBE``, so that a wrong one is soon undone.
"""

from __future__ import annotations

__all__ = ["FIRST_PROBE", "LAST_PROBE", "MARGIN", "PROBE_CALLS", "GilHandoff"]

FIRST_PROBE = 16
"""Calls the way in use before the first probe of the other."""

LAST_PROBE = 1024
"""The most calls the way in use between two probes."""

PROBE_CALLS = 3
"""Calls in a row the other way, in a probe."""

MARGIN = 0.05
"""How much sooner a probe's calls must be answered for the other way to be used."""

_WEIGHT = 0.2  # of each new round trip in the running mean of the way in use


class GilHandoff:
    """Chooses, call by call, whether to hand the GIL over (see the module's
    docstring); told each chosen call's round trip in seconds.

    Attributes:
        handing: The way in use: with a hand-over, or not.
    """

    __slots__ = ("_gap", "_probe", "_recent", "_until_probe", "handing")

    def __init__(self) -> None:
        self.handing = False
        self._recent: float | None = None  # running mean of the way in use
        self._gap = self._until_probe = FIRST_PROBE
        self._probe: list[float] | None = None  # while a probe runs: its round trips

    def choose(self) -> bool:
        """Whether to hand the GIL over with this call."""
        if self._probe is None:
            self._until_probe -= 1
            if self._until_probe > 0 or self._recent is None:
                return self.handing
            self._probe = []
        return not self.handing

    def observe(self, handed: bool, seconds: float) -> None:
        """A call went ``handed`` over (or not) and was answered after ``seconds``."""
        recent, probe = self._recent, self._probe
        if handed == self.handing or probe is None:
            self._recent = seconds if recent is None else recent + _WEIGHT * (seconds - recent)
            return
        probe.append(seconds)
        if len(probe) < PROBE_CALLS:
            return
        self._probe = None
        mean = sum(probe) / len(probe)
        if recent is not None and mean < (1.0 - MARGIN) * recent:
            self.handing, self._recent, self._gap = handed, mean, FIRST_PROBE
        else:
            self._gap = min(2 * self._gap, LAST_PROBE)
        self._until_probe = self._gap
