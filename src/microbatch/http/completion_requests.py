"""What a completion or chat completion request asks, decoded and checked: the
bodies of ``/v1/completions`` and ``/v1/chat/completions`` as msgspec structs, and
:class:`Asked`, the one shape both come to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from .openai_errors import MAX_INPUTS, OpenAIError, param_of

__all__ = ["Asked", "ChatMessage", "chat_asked", "completion_asked"]


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat: who said it (``system``, ``user``, ``assistant``...)
    and its text."""

    role: str
    content: str


_Tokens = Annotated[int, msgspec.Meta(ge=1)]
_Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)]
_Stop = (
    str | Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(max_length=4)]
)
_N = Annotated[int, msgspec.Meta(ge=1, le=128)]


class _StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _CompletionRequest(msgspec.Struct):
    model: str
    prompt: str | Annotated[list[str], msgspec.Meta(min_length=1, max_length=MAX_INPUTS)]
    max_tokens: _Tokens | None = None
    temperature: _Temperature | None = None
    stop: _Stop | None = None
    n: _N = 1
    stream: bool = False
    stream_options: _StreamOptions | None = None
    echo: bool = False
    logprobs: int | None = None
    user: str | None = None


class _Part(msgspec.Struct):
    type: str
    text: str = ""


class _Message(msgspec.Struct):
    role: str
    content: str | list[_Part] | None = None
    name: str | None = None


class _ChatRequest(msgspec.Struct):
    model: str
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1)]
    max_tokens: _Tokens | None = None
    max_completion_tokens: _Tokens | None = None
    temperature: _Temperature | None = None
    stop: _Stop | None = None
    n: _N = 1
    stream: bool = False
    stream_options: _StreamOptions | None = None
    logprobs: bool = False
    user: str | None = None


_decode_completion = msgspec.json.Decoder(_CompletionRequest).decode
_decode_chat = msgspec.json.Decoder(_ChatRequest).decode


@dataclass(frozen=True)
class Asked:
    """One request, whichever route it came by: its prompts and how to answer
    (a chat's one prompt is made by its model's template)."""

    model: str
    prompts: list[str]
    max_tokens: int | None
    temperature: float | None
    stops: list[str]
    n: int
    stream: bool
    include_usage: bool
    chat: bool


def _decoded(decode: Callable[[bytes], Any], body: bytes) -> Any:
    try:
        return decode(body)
    except msgspec.ValidationError as error:
        raise OpenAIError(
            400,
            f"Invalid request body: {error}",
            code="invalid_request",
            param=param_of(str(error)),
        ) from None
    except msgspec.DecodeError as error:
        raise OpenAIError(400, f"Invalid request body: {error}", code="invalid_request") from None


def _stops(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else stop


def completion_asked(body: bytes) -> Asked:
    """A ``/v1/completions`` body, decoded and checked.

    Raises:
        OpenAIError: It is malformed, or asks what this server does not do (400).
    """
    request: _CompletionRequest = _decoded(_decode_completion, body)
    if request.echo:
        raise OpenAIError(400, "This server does not support 'echo'", param="echo")
    if request.logprobs is not None:
        raise OpenAIError(400, "This server does not support 'logprobs'", param="logprobs")
    prompt = request.prompt
    usage = request.stream_options is not None and request.stream_options.include_usage
    return Asked(
        request.model,
        [prompt] if isinstance(prompt, str) else prompt,
        request.max_tokens,
        request.temperature,
        _stops(request.stop),
        request.n,
        request.stream,
        usage,
        chat=False,
    )


def chat_asked(body: bytes) -> tuple[Asked, list[ChatMessage]]:
    """A ``/v1/chat/completions`` body, decoded and checked, and its messages.

    Raises:
        OpenAIError: It is malformed, or asks what this server does not do (400).
    """
    request: _ChatRequest = _decoded(_decode_chat, body)
    if request.logprobs:
        raise OpenAIError(400, "This server does not support 'logprobs'", param="logprobs")
    messages = []
    for message in request.messages:
        content = message.content
        if isinstance(content, list):
            if any(part.type != "text" for part in content):
                raise OpenAIError(400, "Only text message parts are supported", param="messages")
            content = "".join(part.text for part in content)
        messages.append(ChatMessage(message.role, content or ""))
    usage = request.stream_options is not None and request.stream_options.include_usage
    asked = Asked(
        request.model,
        [],  # the template makes the prompt, once the model is known
        request.max_completion_tokens or request.max_tokens,
        request.temperature,
        _stops(request.stop),
        request.n,
        request.stream,
        usage,
        chat=True,
    )
    return asked, messages
