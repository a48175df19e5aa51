"""The embedding example batches by token budget, texts of similar length together."""

from __future__ import annotations

import asyncio

import pytest

import examples.embeddings
from examples.embeddings import (
    GPU_TOKEN_BUDGET,
    MAX_TOKENS,
    TOKEN_BUDGET,
    EmbedRequest,
    TokenCounter,
    make_service,
)

pytestmark = pytest.mark.timeout(300)


def test_a_text_costs_its_token_count_truncated_like_the_model() -> None:
    count = TokenCounter()
    assert count(EmbedRequest("A man is playing a guitar.")) == 9  # [CLS] 7 tokens [SEP]
    assert count(EmbedRequest("word " * 1000)) == MAX_TOKENS


@pytest.mark.parametrize("gpu", [False, True])
def test_with_a_gpu_batches_are_larger_and_cost_more_tokens(
    gpu: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(examples.embeddings, "gpu_present", lambda: gpu)
    service = make_service()
    encode = service.stages[-1].config
    assert [stage.name for stage in service.stages] == (
        ["tokenize", "encode"] if gpu else ["embed"]
    )
    assert encode.max_batch_cost == (GPU_TOKEN_BUDGET if gpu else TOKEN_BUDGET)
    assert encode.max_batch_size == (128 if gpu else 64)
    # told, either way
    told = make_service(token_budget=4096, max_texts=16).stages[-1].config
    assert (told.max_batch_cost, told.max_batch_size) == (4096, 16)


async def test_texts_of_mixed_lengths_are_batched_within_the_token_budget() -> None:
    short = [EmbedRequest(f"Short text number {i}.") for i in range(24)]
    long = [
        EmbedRequest(f"A much longer text, number {i}, " + "with many words " * 40)
        for i in range(4)
    ]
    service = make_service(split=False)
    config = service.stages[0].config
    assert config.max_batch_cost == TOKEN_BUDGET and config.group_by_cost
    async with service:
        answers = await asyncio.gather(
            *(service.submit(request, timeout_s=120) for request in [*long, *short])
        )
        stats = service.stats().stages[0].batching
    assert len(answers) == 28 and all(len(a.embedding) == 384 for a in answers)
    assert stats.batch_cost_sum > 0
    assert 0 < stats.padding_efficiency <= 1
