"""A completion's choices read from their streams (``http/completion_choices.py``),
or one choice written straight (``Answer.one_choice_framing``): why each ended, and
that each stream is left."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from microbatch.http.completion_answers import Answer
from microbatch.http.completion_choices import Choices, Piece
from microbatch.http.completion_requests import Asked


class _Chunks:
    """A stream of ``chunks``, then its end; remembers being left."""

    def __init__(self, chunks: str) -> None:
        self._chunks = iter(chunks)
        self.left = False

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        await asyncio.sleep(0)
        for chunk in self._chunks:
            return chunk
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.left = True


def _read(streams: list[_Chunks], stops: list[str], max_tokens: int | None) -> list[Piece]:
    async def main() -> list[Piece]:
        choices = Choices(list(streams), str)
        try:
            return [piece async for piece in choices.pieces(stops, max_tokens)]
        finally:
            await choices.close()

    return asyncio.run(main())


def _ends(pieces: list[Piece]) -> dict[int, tuple[str, str | None, int]]:
    texts: dict[int, str] = {}
    for piece in pieces:
        texts[piece.index] = texts.get(piece.index, "") + piece.text
    return {p.index: (texts[p.index], p.finish_reason, p.chunks) for p in pieces if p.finish_reason}


def test_each_choice_ends_with_why() -> None:
    streams = [_Chunks("abcde"), _Chunks("ab"), _Chunks("abcdefgh"), _Chunks("xyz")]
    assert _ends(_read(streams, ["z"], max_tokens=5)) == {
        0: ("abcde", "length", 5),  # max_tokens reached
        1: ("ab", "stop", 2),  # the model ended by itself before max_tokens
        2: ("abcde", "length", 5),  # the model went on past max_tokens: left
        3: ("xy", "stop", 3),  # a stop sequence
    }
    assert all(stream.left for stream in streams)


def test_without_max_tokens_a_model_that_ends_ends_for_length() -> None:
    assert _ends(_read([_Chunks("abc")], [], max_tokens=None)) == {0: ("abc", "length", 3)}


def test_one_choice_alone_ends_as_among_others() -> None:
    for chunks, ended in [("abcde", "length"), ("ab", "stop"), ("abcdefgh", "length")]:
        stream = _Chunks(chunks)
        assert _ends(_read([stream], ["z"], max_tokens=5))[0][1] == ended
        assert stream.left
    stopped = _Chunks("xyz")
    assert _ends(_read([stopped], ["z"], max_tokens=5)) == {0: ("xy", "stop", 3)}
    assert stopped.left


def _straight(chunks: str, max_tokens: int | None, chat: bool = False) -> list[Any]:
    """The events of ``chunks`` written straight (``Answer.one_choice_framing``)."""
    asked = Asked("m", ["p"], max_tokens, None, [], 1, True, True, chat)
    left: list[int] = []
    framing = Answer(asked, "cmpl-1", 0, 1).one_choice_framing(str, lambda: left.append(1))
    data = b"".join([*(framing.chunk(chunk) for chunk in chunks), framing.end({})])
    assert len(left) == (max_tokens is not None and len(chunks) >= max_tokens)
    events = [line.removeprefix(b"data: ") for line in data.split(b"\n\n") if line]
    assert events[-1] == b"[DONE]"
    return [json.loads(event) for event in events[:-1]]


def test_written_straight_a_choice_ends_with_why_and_its_usage() -> None:
    *texts, last, usage = _straight("abcde", max_tokens=3)  # the model went on: left
    assert [event["choices"][0]["text"] for event in texts] == ["a", "b", "c"]
    assert last["choices"][0]["finish_reason"] == "length"
    assert usage["usage"] == {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
    *_, last, usage = _straight("ab", max_tokens=3)  # it ended by itself
    assert (last["choices"][0]["finish_reason"], usage["usage"]["completion_tokens"]) == ("stop", 2)
    role, *deltas, last, _ = _straight("ab", max_tokens=None, chat=True)
    assert role["choices"][0]["delta"] == {"role": "assistant"}
    assert [event["choices"][0]["delta"]["content"] for event in deltas] == ["a", "b"]
    assert last["choices"][0]["finish_reason"] == "length"
    role, last, _ = _straight("", max_tokens=2, chat=True)  # no text at all: still its role
    assert (role["choices"][0]["delta"], last["choices"][0]["finish_reason"]) == (
        {"role": "assistant"},
        "stop",
    )
