"""Per-item outcomes of one batch: results, per-item errors, bisection."""

from __future__ import annotations

import asyncio

import pytest

from microbatch import DeadlineExceeded, ResultLengthError
from microbatch.execution import run_batch, run_batch_async, run_batch_in_time


class Poisoned(Exception):
    pass


def poisoned_model(poison: set[int], calls: list[list[int]]):  # type: ignore[no-untyped-def]
    def model(xs: list[int]) -> list[int]:
        calls.append(list(xs))
        if poison & set(xs):
            raise Poisoned(f"poison in {sorted(poison & set(xs))}")
        return [x * 10 for x in xs]

    return model


def test_results_in_item_order() -> None:
    assert run_batch(lambda xs: [x + 1 for x in xs], [1, 2, 3], True) == [2, 3, 4]


def test_an_exception_in_the_result_list_fails_only_its_item() -> None:
    error = ValueError("bad 2")
    outcomes = run_batch(lambda xs: [error if x == 2 else x for x in xs], [1, 2, 3], True)
    assert outcomes == [1, error, 3]


@pytest.mark.parametrize("poison", [{0}, {7}, {15}, {3, 12}, set(range(16))])
def test_bisection_fails_only_the_poison_items(poison: set[int]) -> None:
    calls: list[list[int]] = []
    outcomes = run_batch(poisoned_model(poison, calls), list(range(16)), True)
    for item, outcome in enumerate(outcomes):
        if item in poison:
            assert isinstance(outcome, Poisoned)
        else:
            assert outcome == item * 10
    # Every item is computed successfully at most once.
    good_runs = [x for call in calls if not poison & set(call) for x in call]
    assert sorted(good_runs) == sorted(set(range(16)) - poison)


def test_one_poison_item_costs_a_logarithmic_number_of_calls() -> None:
    calls: list[list[int]] = []
    run_batch(poisoned_model({37}, calls), list(range(64)), True)
    assert len(calls) == 1 + 2 * 6  # the batch, then two halves per level


def test_without_isolation_the_whole_batch_shares_the_error() -> None:
    calls: list[list[int]] = []
    outcomes = run_batch(poisoned_model({1}, calls), [0, 1, 2], False)
    assert len(calls) == 1
    assert all(isinstance(o, Poisoned) for o in outcomes)
    assert outcomes[0] is outcomes[2]


@pytest.mark.parametrize("reply", [[1], [1, 2, 3, 4], None, 5])
def test_a_result_of_the_wrong_length_fails_every_item_clearly(reply: object) -> None:
    outcomes = run_batch(lambda xs: reply, [1, 2, 3], True)  # type: ignore[arg-type, return-value]
    assert len(outcomes) == 3
    for outcome in outcomes:
        assert isinstance(outcome, ResultLengthError)
        assert "batch of 3 items" in str(outcome)


def test_async_driver_matches_the_sync_one() -> None:
    async def model(xs: list[int]) -> list[int]:
        await asyncio.sleep(0)
        if 5 in xs:
            raise Poisoned("5")
        return [x * 10 for x in xs]

    outcomes = asyncio.run(run_batch_async(model, list(range(8)), True))
    assert [o for i, o in enumerate(outcomes) if i != 5] == [i * 10 for i in range(8) if i != 5]
    assert isinstance(outcomes[5], Poisoned)


def test_base_exceptions_are_not_swallowed() -> None:
    def model(xs: list[int]) -> list[int]:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_batch(model, [1, 2], True)


def test_run_in_time_leaves_out_items_whose_deadline_passed() -> None:
    calls: list[list[int]] = []
    deadlines = [None, 5.0, 20.0, 9.0]
    outcomes = run_batch_in_time(
        poisoned_model(set(), calls), [0, 1, 2, 3], True, deadlines, lambda: 10.0
    )
    assert calls == [[0, 2]]
    assert outcomes[0] == 0 and outcomes[2] == 20
    assert isinstance(outcomes[1], DeadlineExceeded) and isinstance(outcomes[3], DeadlineExceeded)


def test_run_in_time_leaves_out_items_that_expire_during_a_bisection() -> None:
    calls: list[list[int]] = []
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # every look at the clock is one second later
        return now[0]

    deadlines = [100.0] * 7 + [2.5]  # item 7 expires while the poison is searched
    model = poisoned_model({0}, calls)
    outcomes = run_batch_in_time(model, list(range(8)), True, deadlines, clock)
    assert calls[0] == list(range(8))
    assert all(7 not in call for call in calls[1:])
    assert isinstance(outcomes[0], Poisoned) and isinstance(outcomes[7], DeadlineExceeded)
    assert outcomes[1:7] == [x * 10 for x in range(1, 7)]
