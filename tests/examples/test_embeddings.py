"""The MiniLM embedding example: starts offline, embeds deterministically, shuts down."""

from __future__ import annotations

import asyncio
import math

import pytest

from examples.embeddings import DIMENSIONS, EmbedRequest, EmbedResponse, gpu_present, make_service

pytestmark = pytest.mark.timeout(300)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


async def test_paraphrases_are_closer_than_an_unrelated_sentence() -> None:
    texts = [
        "A man is playing a guitar.",
        "Someone is playing the guitar.",
        "The stock market fell sharply on Monday.",
    ]
    service = make_service()
    stages = ["tokenize", "encode"] if gpu_present() else ["embed"]  # the default layout
    assert [stage.name for stage in service.stages] == stages
    async with service:
        assert service.ready
        pids = [pid for pool in service.pools for pid in pool.pids]
        answers = await asyncio.gather(
            *(service.submit(EmbedRequest(text), timeout_s=120) for text in texts * 3)
        )
        again = await service.submit(EmbedRequest(texts[0]), timeout_s=120)
    assert all(isinstance(a, EmbedResponse) for a in answers)
    assert all(len(a.embedding) == DIMENSIONS == 384 for a in answers)
    assert all(abs(math.hypot(*a.embedding) - 1.0) < 1e-4 for a in answers)  # unit length
    guitar, paraphrase, stocks = (a.embedding for a in answers[:3])
    assert cosine(guitar, paraphrase) > 0.7 > 0.2 > cosine(guitar, stocks)
    assert cosine(guitar, paraphrase) > cosine(paraphrase, stocks) + 0.5
    # the same text gives the same vector, whatever batch it ran in
    for a, b in zip(answers[:3], answers[3:6], strict=True):
        assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding, strict=True)) < 1e-5
    assert max(abs(x - y) for x, y in zip(again.embedding, guitar, strict=True)) < 1e-5
    assert pids and not service.ready


async def test_both_layouts_give_the_same_vectors() -> None:
    whole, split = make_service(split=False), make_service(split=True)
    assert [stage.name for stage in whole.stages] == ["embed"]
    assert [stage.name for stage in split.stages] == ["tokenize", "encode"]
    text = EmbedRequest("A man is playing a guitar.")
    try:  # both started at once: each loads the model in its own worker processes
        await asyncio.gather(whole.start(), split.start())
        one, other = await asyncio.gather(
            whole.submit(text, timeout_s=120), split.submit(text, timeout_s=120)
        )
    finally:
        await asyncio.gather(whole.close(), split.close())
    assert max(abs(x - y) for x, y in zip(one.embedding, other.embedding, strict=True)) < 1e-5
