"""A Stage takes every BatchConfig setting as a keyword."""

from __future__ import annotations

import pytest

from microbatch import BatchConfig, FixedPolicy, Model, Stage


class Echo(Model):
    def predict(self, items: list[int]) -> list[int]:
        return items


def test_every_batch_setting_is_a_keyword() -> None:
    stage = Stage(
        Echo,
        workers=2,
        max_batch_size=8,
        max_latency_ms=3,
        policy="fixed",
        max_queue=16,
        timeout_s=2.5,
        rows="list",
        isolate_errors=False,
    )
    assert stage.config == BatchConfig(
        max_batch_size=8,
        max_latency_ms=3,
        policy="fixed",
        max_queue=16,
        max_concurrent_batches=2,
        timeout_s=2.5,
        rows="list",
        isolate_errors=False,
    )
    assert Stage(Echo, max_queue=16).config.max_queue == 16
    assert Stage(Echo, mode="thread", size_fn=len).config.size_fn is len


def test_a_keyword_wins_over_the_same_setting_in_batching() -> None:
    batching = BatchConfig(max_batch_size=4, max_queue=100, policy="fixed")
    stage = Stage(Echo, batching=batching, max_queue=16)
    assert (stage.config.max_queue, stage.config.max_batch_size) == (16, 4)
    assert stage.config.policy == "fixed"
    assert Stage(Echo, batching=batching).config.max_queue == 100


def test_keywords_are_validated_as_batch_config_validates() -> None:
    with pytest.raises(ValueError, match="max_queue must be an int >= 1, got 0"):
        Stage(Echo, max_queue=0)
    with pytest.raises(ValueError, match="timeout_s"):
        Stage(Echo, timeout_s=-1)
    with pytest.raises(ValueError, match="either rows or size_fn"):
        Stage(Echo, mode="thread", rows="list", size_fn=len)
    with pytest.raises(ValueError, match="one batch per worker"):
        Stage(Echo, workers=2, max_concurrent_batches=3)
    assert Stage(Echo, workers=2, max_concurrent_batches=2).config.max_concurrent_batches == 2


def test_a_policy_keyword_is_a_prototype_for_the_stage() -> None:
    prototype = FixedPolicy(4, 0.001)
    config = Stage(Echo, mode="thread", policy=prototype).config
    assert config.policy is prototype and config.new_policy() is not prototype
