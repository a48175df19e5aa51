"""The queue's state as a policy sees it, kept current by the batcher on every
arrival: its own module so that the wheel compiles it (``hatch_build.py``), as the
batcher's compiled queue updates it once per item.

:mod:`microbatch.policy` exports it; a compiled class keeps no docstring at run time,
so that module gives it back (``_compiled_docs``).
"""

from __future__ import annotations

from dataclasses import dataclass

# The mean gap between arrivals is averaged over about this many arrivals: enough to
# see through waves of callers that come back together, few enough to follow the load.
_GAP_MEMORY = 32


@dataclass(slots=True)
class QueueState:
    """What a policy may know about a batcher's queue. The batcher keeps it current.

    Attributes:
        size: Queued batch units (items, or rows/tokens with ``size_fn``/rows).
        count: Queued items.
        in_flight: Items in released batches that have not finished.
        oldest_arrival_s: Arrival time of the oldest queued item.
        newest_arrival_s: Arrival time of the newest item.
        arrival_gap_s: Mean time between recent arrivals (``None`` before the second).
        arrivals: Items that ever arrived.
        last_finish_s: When the last batch finished (its callers may come back soon).
        recent_peak: Most items queued or in flight at once, over the last one to two
            windows of ``peak_window_s``: how many callers are around.
        peak_window_s: Length of that window.
        turnaround_s: How long after a batch finishes as many items have arrived as
            it held (averaged): in a closed loop, the time its callers take to
            come back. ``None`` before the first measurement.
        behind: The batch asked about would wait behind a running one (every slot
            is busy and the function queues batches itself).
        running_since_s: While ``behind``: when the longest-running batch started.
        running_size: While ``behind``: that batch's size in units.
        returning: Items of the last finished batch whose callers have not come
            back yet (as counted by arrivals).
        cost: Queued cost (the sum of the queued items' ``cost_fn`` costs; 0
            without one).
    """

    size: int = 0
    count: int = 0
    cost: float = 0.0
    in_flight: int = 0
    oldest_arrival_s: float = 0.0
    newest_arrival_s: float = 0.0
    arrival_gap_s: float | None = None
    arrivals: int = 0
    last_finish_s: float = float("-inf")
    recent_peak: int = 0
    peak_window_s: float = 1.0
    turnaround_s: float | None = None
    behind: bool = False
    running_since_s: float = 0.0
    running_size: int = 0
    returning: int = 0
    _window_start: float = float("-inf")
    _window_peak: int = 0
    _returned_from: float = 0.0  # when the batch being measured finished

    def arrived(self, now: float, size: int, cost: float = 0.0) -> None:
        """Count one new queued item of ``size`` units (and ``cost``) that arrived at ``now``."""
        self.cost += cost
        arrivals, count = self.arrivals, self.count
        if arrivals:
            gap = now - self.newest_arrival_s
            mean = self.arrival_gap_s
            if mean is None:
                self.arrival_gap_s = gap
            else:
                weight = 1.0 / (arrivals if arrivals < _GAP_MEMORY else _GAP_MEMORY)
                self.arrival_gap_s = mean + weight * (gap - mean)
        if not count:
            self.oldest_arrival_s = now
        if self.returning:
            self.returning -= 1
            if not self.returning:
                self._turned_around(now - self._returned_from)
        self.newest_arrival_s = now
        self.arrivals = arrivals + 1
        self.count = count = count + 1
        self.size += size
        active = count + self.in_flight
        if now - self._window_start >= self.peak_window_s:
            recent = now - self._window_start < 2 * self.peak_window_s
            self.recent_peak = max(self._window_peak if recent else 0, active)
            self._window_peak = active
            self._window_start = now
        elif active > self._window_peak:
            self._window_peak = active
            if active > self.recent_peak:
                self.recent_peak = active

    def left(self, size: int, cost: float = 0.0) -> None:
        """Forget one queued item that will not run (cancelled or expired)."""
        self.count -= 1
        self.size -= size
        self.cost = self.cost - cost if self.count else 0.0

    def released(self, count: int, size: int, cost: float = 0.0) -> None:
        """``count`` queued items of ``size`` units (``cost`` in all) went out as a batch."""
        self.count -= count
        self.size -= size
        self.cost = self.cost - cost if self.count else 0.0
        self.in_flight += count

    def finished(self, count: int, now: float) -> None:
        """A batch of ``count`` items finished at ``now``."""
        self.in_flight -= count
        self.last_finish_s = now
        if self.returning:  # the last batch's callers are not all back yet
            self._turned_around(now - self._returned_from)
        self.returning = count
        self._returned_from = now

    def _turned_around(self, seconds: float) -> None:
        mean = self.turnaround_s
        self.turnaround_s = seconds if mean is None else mean + 0.2 * (seconds - mean)
