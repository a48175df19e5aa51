"""When a batch is released: the fixed and the adaptive policy.

A batcher asks its policy "at what time should the queued items go?" whenever a
slot is free and something changed (an arrival, a finished batch, a timer). A time at
or before ``now`` means "release now"; a later time means "wait, and ask me again
then or at the next arrival". Policies never sleep and never read a clock: the
batcher passes ``now``, which keeps every decision a pure, testable function.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ._compiled_docs import restore_docstring
from ._queue_state import QueueState
from .cost_models import CostModel, ShapeCostModel

__all__ = [
    "AdaptivePolicy",
    "CostModel",
    "FixedPolicy",
    "Policy",
    "QueueState",
    "ShapeCostModel",
]

restore_docstring(QueueState)

# Fewer callers are not split into two cohorts: a small cohort's turnaround is mostly
# its fixed part (wake-ups, the worker's pipe), which halving the cohort does not halve.
_MIN_SPLIT_CALLERS = 32


@runtime_checkable
class Policy(Protocol):
    """Decides when queued items are released as a batch.

    Implementations keep whatever state they like; the batcher calls them from one
    thread (or under a lock) at a time.
    """

    def release_at(self, state: QueueState, now: float) -> float:
        """When to release the queued items: ``<= now`` for now, else a later time."""

    def batch_finished(self, size: int, duration_s: float) -> None:
        """Learn from a batch of ``size`` units that took ``duration_s`` to run."""


class FixedPolicy:
    """Release when the batch is full or its oldest item has waited ``max_latency_s``.

    This is the classic size-or-timeout trigger (TF Serving, Triton, MOSEC, Ray): the
    timer starts at the first item's arrival.
    """

    def __init__(
        self, max_batch_size: int, max_latency_s: float, *, max_batch_cost: float | None = None
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_latency_s = max_latency_s
        self.max_batch_cost = max_batch_cost

    def release_at(self, state: QueueState, now: float) -> float:
        """Now if full (in units or in cost), else the oldest arrival plus the latency bound."""
        if _full(state, self.max_batch_size, self.max_batch_cost):
            return now
        return state.oldest_arrival_s + self.max_latency_s

    def batch_finished(self, size: int, duration_s: float) -> None:
        """The fixed policy learns nothing."""


def _full(state: QueueState, max_batch_size: int, max_batch_cost: float | None) -> bool:
    """Whether the queued items fill a batch, in units or in cost."""
    return state.size >= max_batch_size or (
        max_batch_cost is not None and state.cost >= max_batch_cost
    )


class AdaptivePolicy:
    """Release as soon as waiting longer is not worth it, within a latency bound.

    It learns the batch cost ``a + b * size`` from finished batches, and releases
    the queued items when any of these holds:

    1. the batch is full;
    2. every caller seen recently is queued or already in flight, so no one else is
       coming soon (this is why it never waits at concurrency 1);
    3. waiting would push the oldest item past ``max_latency_s``, given the
       predicted run time of a batch one item larger;
    4. the next arrival is not expected before that latest release time;
    5. the queue formed while the slots were idle, and arrivals are slow enough
       that batches of the current size keep up with them at
       ``target_utilization`` of the slots;
    6. the next arrival is overdue, so the stream has paused: no arrival within
       twice the mean gap (or ``patience_share`` of the predicted batch cost, if
       longer) after the last arrival or finished batch.

    Otherwise it asks to be woken at the earlier of the latency limit (3) and the
    overdue time (6), or at the next arrival.

    Items that waited through a batch (or would wait behind a running one) are
    held back, unless full or at the latency limit, only while merging them with
    that batch's callers pays: those come back within the turnaround, and one batch
    instead of two saves ``cost(queued) + cost(theirs) - cost(both)`` of model time.
    So they are held while the turnaround is shorter than that saving, for at most
    the saving (past it, waiting costs more than it saves). Otherwise, with a slot
    free, they go at once ("waited"); behind a running batch, they are handed over
    only when it is predicted to have ``handoff_share`` of its time left: handing
    them over sooner would not start them sooner, it would only stop the batch from
    growing (and the items arriving meanwhile would wait behind two batches).

    A batch may be capped at half the callers (:attr:`batch_limit`). In a closed
    loop, where callers come back only after their results, the callers of one batch
    take the turnaround to come back, and the model waits meanwhile. Two cohorts of
    half the callers alternate instead: one batch runs while the other's callers come
    back. The cap is set when that is predicted to serve at least ``split_gain``
    times as many items per second (kept while it serves more at all), the half
    batch's run covers its callers' turnaround (else the model waits anyway, and
    halving only adds batches), and no more items are queued or running than
    callers were seen (else arrivals outrun the batches: whole ones serve more).
    """

    def __init__(
        self,
        max_batch_size: int,
        max_latency_s: float,
        *,
        slots: int = 1,
        target_utilization: float = 0.8,
        patience_share: float = 0.25,
        handoff_share: float = 0.05,
        max_batch_cost: float | None = None,
        split_gain: float = 1.25,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_batch_cost = max_batch_cost
        self.max_latency_s = max_latency_s
        self.slots = slots
        self.target_utilization = target_utilization
        self.patience_share = patience_share
        self.handoff_share = handoff_share
        self.split_gain = split_gain
        self.batch_limit: int | None = None  # set by release_at: see batch_cap()
        self._last_size = 0
        self._split = False  # the last cap was half the callers
        self._split_key: tuple[float, int, int, bool] | None = None
        self._split_pays = False
        self.cost = CostModel()
        self.shape = ShapeCostModel()
        self._padding = 1.0  # recent batches' cost over their items' summed cost
        self._cost_per_item = 0.0  # recent items' mean cost
        self.reason = ""

    def release_at(self, state: QueueState, now: float) -> float:
        """The release time by the rules in the class docstring.

        ``reason`` names the rule behind the last decision ("full", "callers",
        "latency", "merge", "behind", "no-arrival", "keeps-up", "paused", or "wait").
        """
        self.batch_limit = cap = self.batch_cap(state)
        at = self._by_rules(state, now, cap)
        if at <= now and state.behind and self.reason != "full":
            running_s = self._predict(state, state.running_size)
            handoff = state.running_since_s + (1.0 - self.handoff_share) * running_s
            if handoff > now:
                self.reason = "behind"
                return handoff
        return at

    def batch_cap(self, state: QueueState) -> int:
        """Most units the next batch should take: ``max_batch_size``, or half the
        callers when two alternating cohorts serve more (the class docstring)."""
        self._split = split = self._splits(state)
        return (
            (min(state.recent_peak, self.max_batch_size) + 1) // 2 if split else self.max_batch_size
        )

    def _splits(self, state: QueueState) -> bool:
        turnaround, last = state.turnaround_s, self._last_size
        if turnaround is None or last <= 0 or self.slots != 1 or self.max_batch_cost is not None:
            return False
        whole = min(state.recent_peak, self.max_batch_size)
        if whole < _MIN_SPLIT_CALLERS or state.count + state.in_flight > whole:
            return False  # too few to split, or more than the callers: arrivals outrun
        key = (turnaround, last, whole, self._split)
        if key != self._split_key:  # the inputs change once a batch: decide once a batch
            self._split_key = key
            half = (whole + 1) // 2
            per_caller = turnaround / last  # the callers come back one after another
            run_half = self._predict(state, half)
            if run_half <= 0 or run_half < per_caller * half:  # the model would wait anyway
                self._split_pays = False
            else:
                one = whole / (self._predict(state, whole) + per_caller * whole)
                gain = 1.0 if self._split else self.split_gain
                self._split_pays = half / run_half >= gain * one
        return self._split_pays

    def _by_rules(self, state: QueueState, now: float, cap: int) -> float:
        size = state.size
        if _full(state, cap, self.max_batch_cost) or self.max_latency_s <= 0:
            self.reason = "full"
            return now
        latest = state.oldest_arrival_s + self.max_latency_s - self._predict(state, size + 1)
        waited = state.oldest_arrival_s < state.last_finish_s  # queued through a batch
        if latest > now and (state.behind or waited):
            merge_at = self._merge_until(state, latest, cap)
            if merge_at > now:
                self.reason = "merge"
                return merge_at
            if not state.behind:  # the slot is free: no reason to keep it idle
                self.reason = "waited"
                return now
        if state.count + state.in_flight >= state.recent_peak:
            self.reason = "callers"
            return now
        gap = state.arrival_gap_s
        if latest <= now or gap is None:
            self.reason = "latency"
            return now
        if state.newest_arrival_s + gap > latest:
            self.reason = "no-arrival"
            return now
        # Slot time that arrivals need per second if every batch had this size. Only
        # when the queue formed after the last batch: items that waited through a
        # batch mean the load is high, and in a closed loop the arrival rate only
        # mirrors the batch sizes chosen, so it cannot tell whether they suffice.
        if state.oldest_arrival_s > state.last_finish_s:
            load = self._predict(state, size) / (size * gap) if gap > 0 else float("inf")
            if load <= self.target_utilization * self.slots:
                self.reason = "keeps-up"
                return now
        # Patience for the next arrival: bursty callers arrive in waves, so allow a
        # small share of the batch's own cost beyond twice the mean gap.
        patience = max(2 * gap, self.patience_share * self._predict(state, size + 1))
        at = min(latest, max(state.newest_arrival_s, state.last_finish_s) + patience)
        self.reason = "paused" if at <= now else "wait"
        return at

    def _merge_until(self, state: QueueState, latest: float, cap: int) -> float:
        """Until when to hold the queue for the callers of the running batch (or of
        the one that just finished), or ``-inf`` when merging with them does not pay."""
        turnaround = state.turnaround_s
        coming = state.in_flight if state.behind else state.returning
        both = state.size + coming
        if turnaround is None or not coming or both > cap:
            return float("-inf")
        predict = self._predict
        saved = predict(state, state.size) + predict(state, coming) - predict(state, both)
        if turnaround >= saved:
            return float("-inf")
        # Waiting pays until it has cost as much as it saves; the callers coming
        # back all at once end it sooner (nobody is left to wait for).
        return latest if state.behind else min(latest, state.last_finish_s + saved)

    def batch_finished(self, size: int, duration_s: float) -> None:
        """Feed the cost model."""
        self.cost.observe(size, duration_s)
        self._last_size = size

    def batch_cost_finished(self, items: int, cost: float, total: float, duration_s: float) -> None:
        """Learn from a batch's shape: ``items`` items whose costs sum to ``total``,
        counted as ``cost`` (padded or summed), ran in ``duration_s``. From then on
        run times are predicted from the shape of the queued items."""
        if items <= 0 or total <= 0:
            return
        self.shape.observe(items, cost, duration_s)
        weight = 1.0 if self.shape.samples == 1 else 0.1
        self._padding += weight * (cost / total - self._padding)
        self._cost_per_item += weight * (total / items - self._cost_per_item)

    def _predict(self, state: QueueState, units: int) -> float:
        """Predicted run time of a batch of ``units`` of the queued items: from its
        shape once batches' costs are known, else from its units."""
        if self.shape.samples < 2 or units <= 0:
            return self.cost.predict(units)
        items = units * state.count / state.size if state.size else float(units)
        per_item = state.cost / state.count if state.count and state.cost else self._cost_per_item
        return self.shape.predict(items, items * per_item * self._padding)
