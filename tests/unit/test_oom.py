"""Out-of-memory errors: recognised, split, and the ceiling learned from them."""

from __future__ import annotations

from typing import Any

from microbatch.execution import run_batch
from microbatch.oom import CostCeiling, MemorySplits, is_out_of_memory


class OutOfMemoryError(RuntimeError):
    """Named as torch's, but not from torch."""


class DeviceFull(Exception):
    pass


def test_out_of_memory_errors_are_recognised() -> None:
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(OutOfMemoryError())  # the name alone is not enough
    torch_like = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch.cuda"})
    assert is_out_of_memory(torch_like())
    assert is_out_of_memory(DeviceFull(), (DeviceFull,))
    assert not is_out_of_memory(ValueError(), (DeviceFull,))


def limited(limit: int, calls: list[list[int]]) -> Any:
    def model(items: list[int]) -> list[int]:
        calls.append(list(items))
        if sum(items) > limit:
            raise MemoryError(f"{sum(items)} > {limit}")
        return [item * 2 for item in items]

    return model


def test_a_batch_that_runs_out_of_memory_is_split_even_without_isolating_errors() -> None:
    calls: list[list[int]] = []
    memory = MemorySplits()
    outcomes = run_batch(limited(5, calls), [1, 2, 3, 4], False, None, memory)
    assert outcomes == [2, 4, 6, 8]
    assert memory.failed == [(0, 1, 2, 3), (2, 3)]  # 10 failed, then 3+4=7 failed
    assert calls == [[1, 2, 3, 4], [1, 2], [3, 4], [3], [4]]


def test_an_item_that_runs_out_of_memory_alone_gets_its_own_error() -> None:
    memory = MemorySplits()
    outcomes = run_batch(limited(5, []), [1, 9, 2], False, None, memory)
    assert outcomes[0] == 2 and outcomes[2] == 4
    assert isinstance(outcomes[1], MemoryError)


def test_other_errors_are_not_split_without_isolating_errors() -> None:
    def model(items: list[int]) -> list[int]:
        raise ValueError("bad")

    outcomes = run_batch(model, [1, 2], False, None, MemorySplits())
    assert [type(outcome) for outcome in outcomes] == [ValueError, ValueError]


def test_the_ceiling_drops_below_a_failed_cost_and_is_probed_back_up_slowly() -> None:
    ceiling = CostCeiling(backoff=0.5, probe_after=3, probe_step=2.0)
    ceiling.succeeded(100.0)
    assert ceiling.value is None  # nothing learned from success alone
    ceiling.ran_out(100.0)
    assert ceiling.value == 50.0
    ceiling.ran_out(80.0)
    assert ceiling.value == 40.0
    for _ in range(2):
        ceiling.succeeded(40.0)
    ceiling.succeeded(1.0)  # far below the ceiling: says nothing about it
    assert ceiling.value == 40.0
    ceiling.succeeded(40.0)
    assert ceiling.value == 80.0
