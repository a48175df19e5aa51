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


class Table:
    """Like a pandas DataFrame: ``len()`` counts rows, iterating yields column names."""

    def __init__(self, rows: int, columns: list[str]) -> None:
        self.rows = rows
        self.columns = columns

    def __len__(self) -> int:
        return self.rows

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.columns)

    def __getitem__(self, key: object) -> object:
        raise KeyError(key)


def test_a_result_whose_len_and_iteration_disagree_fails_every_item() -> None:
    outcomes = run_batch(lambda xs: Table(len(xs), ["label", "score"]), [1, 2, 3], True)  # type: ignore[arg-type,return-value]
    assert len(outcomes) == 3
    assert all(isinstance(outcome, ResultLengthError) for outcome in outcomes)
    assert "iterates 2 values" in str(outcomes[0])


def test_a_numpy_result_gives_each_item_its_row() -> None:
    import numpy as np  # a core dependency

    outcomes = run_batch(lambda xs: np.arange(len(xs) * 2).reshape(len(xs), 2), [1, 2], True)
    assert [list(row) for row in outcomes] == [[0, 1], [2, 3]]


async def test_a_table_result_fails_every_caller_of_the_batcher() -> None:
    from microbatch import Batcher

    batcher: Batcher[int, object] = Batcher(
        # its iteration has one value more than its len, whatever the batch's size
        lambda xs: Table(len(xs), ["a"] * (len(xs) + 1)),
        max_batch_size=3,
        max_latency_ms=50,
    )
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(batcher.submit(x) for x in range(3)), return_exceptions=True), 10
    )
    assert all(isinstance(outcome, ResultLengthError) for outcome in outcomes), outcomes


def test_rows_whose_result_len_and_iteration_disagree_fail_every_caller() -> None:
    from microbatch import ListRows

    parts = ListRows().split(Table(3, ["a", "b"]), [1, 2])
    assert all(isinstance(part, ResultLengthError) for part in parts)
