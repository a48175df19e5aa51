"""How a completion request is answered, OpenAI's way: one ``text_completion`` or
``chat.completion`` object, or a stream of chunk objects as Server-Sent Events
(:data:`OPENAI_SSE`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from .completion_choices import Choices, Piece
from .completion_events import DONE, CompletionEvents
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
    chunk=lambda event: bytes(event),  # made already (see CompletionEvents)
    end=lambda _: DONE,
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

    def stream_events(self) -> CompletionEvents:
        """The templates of this answer's streamed events."""
        kind = "chat.completion.chunk" if self.asked.chat else "text_completion"
        head = self.head(kind)
        if self.asked.include_usage:
            head["usage"] = None
        return CompletionEvents(head, self.asked.chat)

    async def events(self, pieces: AsyncIterator[Piece]) -> AsyncIterator[bytes]:
        """The events of a streamed answer, one or two per piece (a chat choice's
        first piece is preceded by its role, a last piece's text by its end), then
        the usage when asked."""
        events = self.stream_events()
        chat = self.asked.chat
        begun: set[int] = set()
        tokens = 0
        async for piece in pieces:
            if chat and piece.index not in begun:
                begun.add(piece.index)
                yield events.role(piece.index)
            if piece.text:
                yield events.text(piece.index, piece.text)
            if piece.finish_reason is not None:
                tokens += piece.chunks
                yield events.finish(piece.index, piece.finish_reason)
        if self.asked.include_usage:
            yield events.usage(self.usage(tokens))

    def one_choice_framing(
        self, chunk_text: Callable[[Any], str], leave: Callable[[], None]
    ) -> Framing:
        """How to write the chunks of a request's one choice straight from its stream,
        as :data:`OPENAI_SSE` events (no stop sequences: every chunk's text goes out
        as it comes; at ``max_tokens`` chunks the stream is left with ``leave``, and
        a chunk that came with it is dropped): the server's stream writer then
        writes a step's chunks for many streams at once, without waking each
        request's task."""
        events = self.stream_events()
        asked = self.asked
        most = asked.max_tokens
        made = 0
        begun = not asked.chat  # a chat choice's role comes with its first text

        def chunk(value: Any) -> bytes:
            nonlocal made, begun
            if most is not None and made >= most:  # came with the last: the model goes on
                return b""
            made += 1
            if made == most:
                leave()  # its model need not end by itself: it stops at its next step
            text = chunk_text(value)
            if not text:
                return b""
            if not begun:
                begun = True
                return events.role(0) + events.text(0, text)
            return events.text(0, text)

        def end(_: dict[str, Any]) -> bytes:
            reason = "stop" if most is not None and made < most else "length"
            last = events.finish(0, reason)
            if not begun:
                last = events.role(0) + last
            if asked.include_usage:
                last += events.usage(self.usage(made))
            return last + DONE

        return Framing(OPENAI_SSE.name, OPENAI_SSE.media_type, chunk, end, _sse_error)


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
