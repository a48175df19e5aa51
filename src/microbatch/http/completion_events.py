"""The Server-Sent Events of one streamed completion, made from templates: each
kind of chunk object (a choice's text, a chat choice's role, a choice's end, the
usage) is encoded once per request and choice with a marker for its text, so that a
piece of text costs the encoding of that text alone, not of the whole object.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["DONE", "CompletionEvents"]

_encode = msgspec.json.Encoder().encode
_MARK = "\x00text\x00"  # stands for a piece's text in a template (no model name has it)
_MARK_JSON = _encode(_MARK)

DONE = b"data: [DONE]\n\n"
"""The last event of every streamed completion."""


class CompletionEvents:
    """The events of one streamed answer: ``head`` is what every chunk object of it
    shares (``id``, ``object``, ``created``, ``model``, and ``usage`` when asked).

    Args:
        head: The shared fields.
        chat: Chat completion chunks (a ``delta`` per choice) rather than text ones.
    """

    __slots__ = ("_chat", "_head", "_texts")

    def __init__(self, head: dict[str, Any], chat: bool) -> None:
        self._head = head
        self._chat = chat
        self._texts: dict[int, tuple[bytes, bytes]] = {}

    def text(self, index: int, text: str) -> bytes:
        """Choice ``index``'s next piece of text."""
        template = self._texts.get(index)
        if template is None:
            content: Any = {"content": _MARK} if self._chat else _MARK
            encoded = self._event(self._choice(index, content, None))
            before, after = encoded.split(_MARK_JSON, 1)
            template = self._texts[index] = (before, after)
        return template[0] + _encode(text) + template[1]

    def role(self, index: int) -> bytes:
        """A chat choice's first event: its role."""
        return self._event(self._choice(index, {"role": "assistant"}, None))

    def finish(self, index: int, reason: str) -> bytes:
        """Choice ``index``'s last event: why it ended."""
        return self._event(self._choice(index, {} if self._chat else "", reason))

    def usage(self, usage: dict[str, int]) -> bytes:
        """The usage, after every choice ended (``stream_options.include_usage``)."""
        return b"data: " + _encode({**self._head, "choices": [], "usage": usage}) + b"\n\n"

    def _event(self, choice: dict[str, Any]) -> bytes:
        return b"data: " + _encode({**self._head, "choices": [choice]}) + b"\n\n"

    def _choice(self, index: int, content: Any, reason: str | None) -> dict[str, Any]:
        if self._chat:
            return {"index": index, "delta": content, "logprobs": None, "finish_reason": reason}
        return {"index": index, "text": content, "logprobs": None, "finish_reason": reason}
