from __future__ import annotations

import math

import pytest

from microbatch import BatchConfig, FixedPolicy


def test_defaults_are_valid() -> None:
    config = BatchConfig()
    assert config.max_batch_size == 64
    assert config.max_latency_s == pytest.approx(0.010)
    assert config.policy == "adaptive"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_batch_size", 0),
        ("max_batch_size", 2.5),
        ("max_batch_size", True),
        ("max_queue", 0),
        ("max_concurrent_batches", 0),
        ("max_latency_ms", -1),
        ("max_latency_ms", math.inf),
        ("max_latency_ms", math.nan),
        ("timeout_s", 0),
        ("timeout_s", -3),
        ("policy", "greedy"),
        ("rows", "tensor"),
    ],
)
def test_bad_values_are_refused_with_their_value_in_the_message(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field) as caught:
        BatchConfig(**{field: value})  # type: ignore[arg-type]
    assert repr(value) in str(caught.value)


def test_rows_and_size_fn_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="either rows or size_fn"):
        BatchConfig(rows="list", size_fn=len)


def test_config_is_frozen() -> None:
    config = BatchConfig()
    with pytest.raises(AttributeError):
        config.max_batch_size = 3  # type: ignore[misc]


def test_policy_object_is_accepted() -> None:
    policy = FixedPolicy(8, 0.001)
    assert BatchConfig(policy=policy).policy is policy
