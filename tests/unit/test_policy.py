"""Timing decisions, as pure functions of the queue state and ``now``."""

from __future__ import annotations

import pytest

from microbatch import AdaptivePolicy, BatchConfig, CostModel, FixedPolicy, QueueState


def queue(now: float, arrivals: list[float], *, in_flight: int = 0) -> QueueState:
    state = QueueState()
    state.in_flight = in_flight
    for at in arrivals:
        state.arrived(at, 1)
    state.oldest_arrival_s = arrivals[0]
    return state


class TestFixed:
    def test_waits_max_latency_from_the_first_arrival(self) -> None:
        policy = FixedPolicy(max_batch_size=4, max_latency_s=0.010)
        state = queue(0.0, [1.000, 1.004])
        assert policy.release_at(state, 1.005) == pytest.approx(1.010)

    def test_releases_a_full_batch_at_once(self) -> None:
        policy = FixedPolicy(max_batch_size=2, max_latency_s=0.010)
        state = queue(0.0, [1.000, 1.001])
        assert policy.release_at(state, 1.001) == 1.001


class TestCostModel:
    def test_fits_fixed_plus_per_unit_cost(self) -> None:
        model = CostModel()
        for size in (1, 2, 4, 8, 16, 32, 64) * 3:
            model.observe(size, 0.002 + 0.00002 * size)
        assert model.fixed_s == pytest.approx(0.002, rel=1e-6)
        assert model.per_unit_s == pytest.approx(0.00002, rel=1e-6)
        assert model.predict(64) == pytest.approx(0.00328, rel=1e-6)

    def test_a_single_size_is_an_upper_bound_below_and_proportional_above(self) -> None:
        model = CostModel()
        model.observe(4, 0.004)
        model.observe(4, 0.004)
        assert model.predict(1) == pytest.approx(0.004)
        assert model.predict(4) == pytest.approx(0.004)
        assert model.predict(8) == pytest.approx(0.008)

    def test_predicts_nothing_before_a_sample(self) -> None:
        assert CostModel().predict(10) == 0.0

    def test_follows_a_model_that_slows_down(self) -> None:
        model = CostModel()
        for size in (8, 16) * 10:
            model.observe(size, 0.001 * size)
        for size in (8, 16) * 60:
            model.observe(size, 0.002 * size)
        assert model.predict(16) == pytest.approx(0.032, rel=0.05)


class TestAdaptive:
    def make(self, *, batch: int = 64, latency_s: float = 0.010) -> AdaptivePolicy:
        return AdaptivePolicy(batch, latency_s)

    def test_never_waits_at_concurrency_one(self) -> None:
        policy = self.make()
        for _ in range(50):
            policy.batch_finished(1, 0.002)
        state = QueueState()
        now = 0.0
        for _ in range(20):
            state.arrived(now, 1)
            state.oldest_arrival_s = now
            assert policy.release_at(state, now) == now
            state.released(1, 1)
            now += 0.002
            state.finished(1, now)

    def test_waits_for_every_caller_seen_recently(self) -> None:
        policy = self.make()
        for _ in range(10):
            policy.batch_finished(16, 0.0023)
        state = QueueState()
        for i in range(16):  # 16 callers were seen at once
            state.arrived(i * 1e-5, 1)
        state.released(16, 16)
        state.finished(16, 0.003)
        now = 0.003
        for i in range(15):
            state.arrived(now + i * 1e-5, 1)
        state.oldest_arrival_s = now
        assert policy.release_at(state, now + 2e-4) > now + 2e-4  # one caller is missing
        state.arrived(now + 3e-4, 1)
        assert policy.release_at(state, now + 3e-4) == now + 3e-4  # everyone is in

    def test_releases_in_time_for_the_latency_bound(self) -> None:
        policy = self.make(latency_s=0.010)
        for size in (4, 8) * 10:
            policy.batch_finished(size, 0.002 + 0.0001 * size)
        state = QueueState()
        for i in range(5):
            state.arrived(i * 0.0001, 1)
        state.recent_peak = 100  # many callers around: rule 2 does not fire
        state.oldest_arrival_s = 0.0
        state.arrival_gap_s = 0.0001
        # a fast stream would fill the batch: it waits, but not past the bound
        at = policy.release_at(state, 0.0005)
        assert 0.0005 < at <= 0.010 - policy.cost.predict(6) + 1e-12
        # once the bound is near, it goes
        assert policy.release_at(state, 0.0090) == 0.0090

    def test_no_waiting_when_arrivals_are_slow_for_the_model(self) -> None:
        policy = self.make()
        for size in (1, 2) * 10:
            policy.batch_finished(size, 0.0001 * size)  # a cheap model
        state = QueueState()
        state.arrived(0.0, 1)
        state.arrived(0.001, 1)  # one arrival per ms: batch of 2 costs 0.2 ms
        state.recent_peak = 100  # many callers around: rule 2 does not fire
        state.oldest_arrival_s = 0.0
        assert policy.release_at(state, 0.001) == 0.001

    def test_waits_when_arrivals_outpace_small_batches(self) -> None:
        policy = self.make()
        for size in (1, 2, 4) * 10:
            policy.batch_finished(size, 0.002 + 0.00002 * size)
        state = QueueState()
        for i in range(4):
            state.arrived(i * 0.0001, 1)  # 10k arrivals/s: batches of 4 cannot keep up
        state.recent_peak = 100  # many callers around: rule 2 does not fire
        state.oldest_arrival_s = 0.0
        assert policy.release_at(state, 0.0003) > 0.0003

    def test_stops_waiting_when_the_stream_pauses(self) -> None:
        policy = self.make()
        for size in (1, 2, 4) * 10:
            policy.batch_finished(size, 0.002 + 0.00002 * size)
        state = QueueState()
        for i in range(4):
            state.arrived(i * 0.0001, 1)
        state.recent_peak = 100  # many callers around: rule 2 does not fire
        state.oldest_arrival_s = 0.0
        at = policy.release_at(state, 0.0003)
        assert at < 0.010
        assert policy.release_at(state, at) == at

    def test_full_batch_goes_at_once(self) -> None:
        policy = self.make(batch=2)
        state = queue(0.0, [0.0, 0.0])
        state.recent_peak = 100  # many callers around: rule 2 does not fire
        assert policy.release_at(state, 0.0) == 0.0

    def behind(self, *, turnaround_s: float) -> tuple[AdaptivePolicy, QueueState]:
        """8 of 16 callers queued behind a running batch of the other 8."""
        policy = self.make()
        for size in (4, 8, 16) * 10:
            policy.batch_finished(size, 0.002 + 0.00002 * size)  # 2 ms per batch saved
        state = queue(0.0, [1e-4 * i for i in range(8)], in_flight=8)
        state.recent_peak = 16
        state.turnaround_s = turnaround_s
        state.behind = True
        state.running_since_s, state.running_size = 0.0, 8
        return policy, state

    def test_holds_a_batch_behind_a_running_one_while_merging_pays(self) -> None:
        policy, state = self.behind(turnaround_s=0.0005)  # callers back within 0.5 ms
        now = 0.001
        at = policy.release_at(state, now)
        assert policy.reason == "merge"
        assert at == pytest.approx(0.010 - policy.cost.predict(9))  # the latency bound

    def test_sends_a_batch_behind_a_running_one_when_callers_come_back_slowly(self) -> None:
        policy, state = self.behind(turnaround_s=0.003)  # longer than the 2 ms saved
        now = 0.001
        # Not at once: only when the running batch is about to end.
        handoff = (1 - policy.handoff_share) * policy.cost.predict(8)
        assert policy.release_at(state, now) == pytest.approx(handoff)
        assert policy.reason == "behind"
        assert policy.release_at(state, handoff) == handoff
        assert policy.reason == "callers"

    def test_a_batch_behind_a_running_one_grows_until_that_one_is_about_to_end(self) -> None:
        policy = self.make(latency_s=0.002)  # a bound far under the model's 40 ms
        for _ in range(10):
            policy.batch_finished(8, 0.040)
        state = queue(0.010, [0.010], in_flight=2)  # one arrival 10 ms into a batch
        state.behind, state.running_since_s, state.running_size = True, 0.0, 2
        handoff = (1 - policy.handoff_share) * 0.040
        assert policy.release_at(state, 0.010) == pytest.approx(handoff)
        assert policy.reason == "behind"
        state.arrived(0.020, 1)  # it grows meanwhile
        assert policy.release_at(state, 0.020) == pytest.approx(handoff)
        assert policy.release_at(state, handoff) == handoff
        assert state.size == 2

    def test_a_full_batch_goes_behind_a_running_one_at_once(self) -> None:
        policy, state = self.behind(turnaround_s=0.0)
        for i in range(56):
            state.arrived(0.001 + 1e-6 * i, 1)
        assert policy.release_at(state, 0.002) == 0.002
        assert policy.reason == "full"

    def waited(self, *, turnaround_s: float) -> tuple[AdaptivePolicy, QueueState]:
        """Two cohorts of 64 callers: 24 queued while the other 40 ran; those 40
        just finished at 5 ms and are not back yet."""
        policy = self.make()
        for size in (4, 8, 16) * 10:
            policy.batch_finished(size, 0.002 + 0.00002 * size)  # 2 ms per batch saved
        state = queue(0.001, [0.001 + 1e-5 * i for i in range(24)], in_flight=40)
        state.recent_peak = 64
        state.turnaround_s = turnaround_s
        state.finished(40, 0.005)
        return policy, state

    def test_items_that_waited_through_a_batch_go_when_its_callers_come_back_slowly(
        self,
    ) -> None:
        policy, state = self.waited(turnaround_s=0.004)  # longer than the 2 ms saved
        assert policy.release_at(state, 0.005) == 0.005
        assert policy.reason == "waited"

    def test_items_that_waited_through_a_batch_wait_for_its_callers_while_merging_pays(
        self,
    ) -> None:
        policy, state = self.waited(turnaround_s=0.0005)
        saved = policy.cost.predict(24) + policy.cost.predict(40) - policy.cost.predict(64)
        assert policy.release_at(state, 0.005) == pytest.approx(0.005 + saved)
        assert policy.reason == "merge"
        for i in range(39):
            state.arrived(0.0051 + 1e-5 * i, 1)
        assert policy.release_at(state, 0.0055) == pytest.approx(0.005 + saved)
        state.arrived(0.0056, 1)  # the last one is back
        assert policy.release_at(state, 0.0056) == 0.0056
        assert policy.reason == "full" and state.size == 64

    def test_zero_latency_bound_means_no_waiting(self) -> None:
        policy = self.make(latency_s=0.0)
        state = queue(0.0, [0.0])
        state.recent_peak = 100
        assert policy.release_at(state, 0.0) == 0.0


def test_new_policy_builds_a_fresh_policy_per_batcher() -> None:
    config = BatchConfig(max_batch_size=8, max_latency_ms=5, max_concurrent_batches=2)
    first, second = config.new_policy(), config.new_policy()
    assert isinstance(first, AdaptivePolicy) and first is not second
    assert first.slots == 2
    fixed = BatchConfig(policy="fixed", max_latency_ms=5).new_policy()
    assert isinstance(fixed, FixedPolicy) and fixed.max_latency_s == pytest.approx(0.005)


def test_a_policy_object_is_a_prototype_copied_for_each_batcher() -> None:
    prototype = AdaptivePolicy(8, 0.005)
    prototype.cost.observe(4, 0.5)
    config = BatchConfig(policy=prototype)
    first, second = config.new_policy(), config.new_policy()
    assert isinstance(first, AdaptivePolicy) and isinstance(second, AdaptivePolicy)
    assert first is not prototype and second is not first and first.cost is not second.cost
    assert first.cost.samples == prototype.cost.samples  # its settings and state, copied
    first.batch_finished(8, 1.0)
    assert second.cost.samples == prototype.cost.samples  # learning is each one's own


def test_a_policy_factory_is_called_for_each_batcher() -> None:
    config = BatchConfig(policy=lambda: FixedPolicy(4, 0.001))
    first, second = config.new_policy(), config.new_policy()
    assert isinstance(first, FixedPolicy) and first is not second
    with pytest.raises(TypeError, match="not a Policy"):
        BatchConfig(policy=lambda: "fixed").new_policy()  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="policy"):
        BatchConfig(policy=42)  # type: ignore[arg-type]


def test_turnaround_is_the_time_until_as_many_items_arrived_as_finished() -> None:
    state = QueueState()
    for i in range(3):
        state.arrived(i * 1e-6, 1)
    state.released(3, 3)
    state.finished(3, 1.000)
    assert state.turnaround_s is None
    for at in (1.001, 1.002, 1.004):
        state.arrived(at, 1)
    assert state.turnaround_s == pytest.approx(0.004)
    state.released(3, 3)
    state.finished(3, 2.000)
    state.arrived(2.001, 1)
    state.released(1, 1)
    state.finished(1, 2.009)  # two callers never came back: measured up to here
    assert state.turnaround_s == pytest.approx(0.004 + 0.2 * (0.009 - 0.004))


def test_peak_of_callers_is_forgotten_after_two_windows() -> None:
    state = QueueState()
    for i in range(10):
        state.arrived(0.0 + i * 1e-6, 1)
    assert state.recent_peak == 10
    state.released(10, 10)
    state.finished(10, 0.01)
    state.arrived(1.5, 1)  # next window: the old peak is still remembered
    assert state.recent_peak == 10
    state.released(1, 1)
    state.finished(1, 1.6)
    state.arrived(4.0, 1)  # two windows later it is gone
    assert state.recent_peak == 1


class TestCohorts:
    """The adaptive policy caps a batch at half the callers when two alternating
    cohorts keep the model busier than one (a closed loop whose callers take long to
    come back), and never when that would not pay or would cut capacity."""

    @staticmethod
    def closed_loop(
        callers: int, model_fixed_s: float, turnaround_s: float
    ) -> tuple[AdaptivePolicy, QueueState]:
        """A policy that learnt ``fixed + 20 µs/item`` batches of all ``callers``,
        whose callers all came back ``turnaround_s`` after their batch finished."""
        policy = AdaptivePolicy(max_batch_size=64, max_latency_s=0.010)
        for size in (8, 16, 32, 64) * 3:
            policy.batch_finished(size, model_fixed_s + 20e-6 * size)
        policy.batch_finished(callers, model_fixed_s + 20e-6 * callers)
        state = QueueState()
        now = 0.0
        for _ in range(callers):
            state.arrived(now, 1)
        state.released(callers, callers)
        now += model_fixed_s
        state.finished(callers, now)
        for i in range(callers):  # the callers come back one after another
            state.arrived(now + turnaround_s * (i + 1) / callers, 1)
        return policy, state

    def test_sim_at_64_callers_splits_into_two_cohorts_of_32(self) -> None:
        # a 2 ms model, its 64 callers back 4.5 ms after their batch: the model waits
        # most of the time with one cohort; two alternate and keep it busy
        policy, state = self.closed_loop(64, 0.002, 0.0045)
        assert policy.batch_cap(state) == 32
        policy.release_at(state, 1.0)
        assert policy.batch_limit == 32
        assert policy.reason == "full"  # 64 queued, a batch of 32 goes

    def test_no_split_while_one_cohort_serves_as_much(self) -> None:
        # 48 callers back quickly: one batch of 48 per cycle does better than halves
        policy, state = self.closed_loop(48, 0.002, 0.0012)
        assert policy.batch_cap(state) == 64

    def test_no_split_of_fewer_than_32_callers(self) -> None:
        # 16 callers slow to come back: halves would be predicted to pay, but a small
        # cohort's turnaround is mostly its fixed part, which halving does not halve
        policy, state = self.closed_loop(16, 0.002, 0.004)
        assert policy.batch_cap(state) == 64

    def test_no_split_when_the_model_would_wait_for_its_callers_anyway(self) -> None:
        # a tiny model: half the callers take longer to come back than a batch runs
        policy, state = self.closed_loop(64, 0.00005, 0.002)
        assert policy.batch_cap(state) == 64

    def test_no_split_when_arrivals_outrun_the_batches(self) -> None:
        # more items queued and running than callers were seen: an open loop at high
        # load, where half batches would serve fewer items per second
        policy, state = self.closed_loop(64, 0.002, 0.0045)
        state.in_flight = 64
        assert policy.batch_cap(state) == 64

    def test_no_split_before_a_turnaround_is_measured(self) -> None:
        policy = AdaptivePolicy(max_batch_size=64, max_latency_s=0.010)
        state = queue(0.0, [0.0] * 64)
        assert policy.batch_cap(state) == 64
