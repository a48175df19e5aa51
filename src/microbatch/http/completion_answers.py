"""How a completion request is answered, OpenAI's way: one ``text_completion`` or
``chat.completion`` object, or a stream of chunk objects as Server-Sent Events
(:data:`OPENAI_SSE`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec

from .completion_choices import Choices, Piece
from .completion_requests import Asked
from .openai_errors import error_shape
from .streams import Framing

__all__ = ["OPENAI_SSE", "Answer", "whole_answer"]

_encode = msgspec.json.Encoder().encode


def _sse_error(error: dict[str, Any]) -> bytes:
    status = error.get("status", 500)
    return b"data: " + _encode(error_shape(status, error["message"], error["error"])) + b"\n\n"


OPENAI_SSE = Framing(
    "openai-sse",
    b"text/event-stream",
    chunk=lambda value: b"data: " + _encode(value) + b"\n\n",
    end=lambda _: b"data: [DONE]\n\n",
    error=_sse_error,
)
"""OpenAI's Server-Sent Events: ``data: {json}`` per chunk object, ``data: [DONE]``
at the end, ``data: {"error": {...}}`` for an error after the first chunk."""


@dataclass(frozen=True)
class Answer:
    """How one request is answered: the parts every object of its answer shares."""

    asked: Asked
    id: str
    created: int
    prompt_tokens: int

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.asked.model}

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        }

    def whole(self, texts: list[str], reasons: list[str], completion_tokens: int) -> bytes:
        """The answer to a request that does not stream."""
        choices: list[dict[str, Any]] = []
        for index, (text, reason) in enumerate(zip(texts, reasons, strict=True)):
            choice: dict[str, Any] = {"index": index}
            if self.asked.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["logprobs"] = None
            choice["finish_reason"] = reason
            choices.append(choice)
        kind = "chat.completion" if self.asked.chat else "text_completion"
        return _encode(
            {**self.head(kind), "choices": choices, "usage": self.usage(completion_tokens)}
        )

    async def events(self, pieces: AsyncIterator[Piece]) -> AsyncIterator[dict[str, Any]]:
        """The chunk objects of a streamed answer, one or two per piece (a chat
        choice's first piece is preceded by its role, a last piece's text by its
        end), then the usage when asked."""
        chat, kind = (
            self.asked.chat,
            "chat.completion.chunk" if self.asked.chat else "text_completion",
        )
        head = self.head(kind)
        if self.asked.include_usage:
            head["usage"] = None
        begun: set[int] = set()
        tokens = 0
        async for piece in pieces:
            if chat and piece.index not in begun:
                begun.add(piece.index)
                yield {**head, "choices": [_delta(piece.index, {"role": "assistant"}, None)]}
            if piece.text:
                text = {"content": piece.text} if chat else piece.text
                yield {**head, "choices": [_streamed(chat, piece.index, text, None)]}
            if piece.finish_reason is not None:
                tokens += piece.chunks
                empty: Any = {} if chat else ""
                yield {
                    **head,
                    "choices": [_streamed(chat, piece.index, empty, piece.finish_reason)],
                }
        if self.asked.include_usage:
            yield {**head, "choices": [], "usage": self.usage(tokens)}


def _streamed(chat: bool, index: int, text: Any, reason: str | None) -> dict[str, Any]:
    if chat:
        return _delta(index, text, reason)
    return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}


def _delta(index: int, delta: dict[str, str], reason: str | None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}


async def whole_answer(answer: Answer, choices: Choices, count: int) -> bytes:
    """Read every choice to its end; the answer to a request that does not stream."""
    texts, reasons = [""] * count, [""] * count
    tokens = 0
    asked = answer.asked
    async for piece in choices.pieces(asked.stops, asked.max_tokens):
        texts[piece.index] += piece.text
        if piece.finish_reason is not None:
            reasons[piece.index] = piece.finish_reason
            tokens += piece.chunks
    return answer.whole(texts, reasons, tokens)
