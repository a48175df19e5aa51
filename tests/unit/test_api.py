"""The public API is pinned: a change to it is a deliberate change to this test."""

from __future__ import annotations

import microbatch

PUBLIC = {
    "AdaptivePolicy",
    "AsyncBatchedFunction",
    "BatchConfig",
    "BatchSettings",
    "Batcher",
    "BatcherClosed",
    "BatcherStats",
    "Clock",
    "CooperativeBatcher",
    "CostModel",
    "DeadlineExceeded",
    "END",
    "ItemError",
    "FixedPolicy",
    "ItemTooLarge",
    "ListRows",
    "MicrobatchError",
    "Model",
    "MonotonicClock",
    "NumpyRows",
    "Overloaded",
    "Policy",
    "QueueState",
    "RemoteError",
    "Route",
    "ResultLengthError",
    "RowFormat",
    "Servable",
    "Service",
    "ServiceStats",
    "SlowReader",
    "Stage",
    "StageStats",
    "Started",
    "StageFailed",
    "StepModel",
    "Stream",
    "StreamStats",
    "StreamingServable",
    "SyncBatchedFunction",
    "WorkerContext",
    "WorkerDied",
    "batch",
    "deadline_from",
}


def test_all_is_pinned() -> None:
    assert set(microbatch.__all__) == PUBLIC


def test_every_public_name_exists_and_is_documented() -> None:
    for name in microbatch.__all__:
        obj = getattr(microbatch, name)
        assert obj.__doc__, f"{name} has no docstring"


def test_errors_carry_their_http_status() -> None:
    assert microbatch.Overloaded.http_status == 503
    assert microbatch.BatcherClosed.http_status == 503
    assert microbatch.DeadlineExceeded.http_status == 504
    assert microbatch.ItemTooLarge.http_status == 422
    assert microbatch.ResultLengthError.http_status == 500
    assert microbatch.SlowReader.http_status == 408
    for name in ("Overloaded", "BatcherClosed", "DeadlineExceeded", "ItemTooLarge", "SlowReader"):
        assert issubclass(getattr(microbatch, name), microbatch.MicrobatchError)
