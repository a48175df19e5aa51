"""OpenAI-compatible text generation: ``POST /v1/completions`` and
``POST /v1/chat/completions``.

Served for the services that declare themselves text generators: their
``completion_model`` attribute is a :class:`CompletionModel`, and their model
streams (a ``StepModel`` or a generator ``predict``). Each prompt (each of a list,
``n`` times each) is one stream of the service, all opened at once and batched with
everyone else's; each chunk is a piece of text. With ``"stream": true`` the pieces go
out as Server-Sent Events the moment they are made (``data: {json}``, then
``data: [DONE]``); else they are joined into one answer. A stop sequence ends the
text before it and leaves the stream at once: the model stops working on it at its
next step. A request's deadline, token, limits and overload answers are those of
``/stream``; errors have OpenAI's shape (see :mod:`.openai_errors`), and an error
after the first chunk is the stream's last event. ``microbatch serve``'s connection
layer opens and writes a streamed answer itself, with the same functions
(:mod:`.completion_stream`); this route answers every other request.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from ..signature import record_fields
from ..streams import stop_reading
from ..tracing import Tracer
from ..types import Servable, StreamingServable, deadline_from
from .asgi import Receive, Scope, Send, header, send_response
from .completion_answers import OPENAI_SSE, Answer, whole_answer
from .completion_choices import Choices
from .completion_requests import Asked, ChatMessage, chat_asked, completion_asked
from .openai_errors import MAX_INPUTS, OpenAIError, param_of, send_error, unknown_model
from .request_body import ClientDisconnected
from .routing import (
    CLIENT_CLOSED,
    ClientGone,
    Handler,
    RouteHost,
    RouteTable,
    admitted_body,
    until_disconnect,
)
from .server_timing import noted
from .stream_route import OpenedStream
from .streams import FIRST_CHUNK_TIMEOUT_HEADER, first_chunk_timeout_from, send_stream

__all__ = [
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "COMPLETION_MODEL_ATTRIBUTE",
    "ChatMessage",
    "CompletionModel",
    "Generation",
    "TextGenerator",
    "asked_of",
    "completion_model_names",
    "completion_model_of",
    "completion_routes",
    "count_words",
    "new_answer",
    "plain_chat_template",
    "streamed",
    "text_generators",
]

COMPLETION_MODEL_ATTRIBUTE = "completion_model"
"""The attribute of a servable that declares it a text generator."""

COMPLETIONS_PATH = "/v1/completions"
"""Where text is completed."""

CHAT_PATH = "/v1/chat/completions"
"""Where a chat is completed."""

_JSON = b"application/json"


@dataclass(frozen=True)
class Generation:
    """What a request asks of one item: the prompt to go on from, and the bounds it
    gave (None: not given)."""

    prompt: str
    max_tokens: int | None
    temperature: float | None


def plain_chat_template(messages: Sequence[ChatMessage]) -> str:
    """The default chat prompt: one line ``role: content`` per message, then
    ``assistant:`` for the model to go on from."""
    return "".join(f"{message.role}: {message.content}\n" for message in messages) + "assistant:"


def count_words(text: str) -> int:
    """The default prompt-token count: whitespace-separated words."""
    return len(text.split())


@dataclass(frozen=True)
class CompletionModel:
    """Declares a streaming servable a text generator: set it as the servable's
    ``completion_model`` attribute, and ``/v1/completions`` and
    ``/v1/chat/completions`` serve it.

    Args:
        name: The ``model`` clients ask for (default: the servable's name).
        item: Builds the servable's item from a :class:`Generation`. Default: the
            item type is ``str`` (the prompt), or a record with a ``str`` field
            ``prompt`` and, if it has them, ``max_tokens`` and ``temperature``
            (those the request gives; the record validates them: its limits are
            400s).
        chunk_text: A chunk's text (default ``str``).
        chat_template: A chat's prompt from its messages (default
            :func:`plain_chat_template`).
        count_tokens: Counts a prompt's tokens for ``usage`` (default
            :func:`count_words`); a completion's tokens are its chunks.

    Raises:
        ValueError: ``name`` is empty.
    """

    name: str | None = None
    item: Callable[[Generation], Any] | None = None
    chunk_text: Callable[[Any], str] = str
    chat_template: Callable[[Sequence[ChatMessage]], str] = plain_chat_template
    count_tokens: Callable[[str], int] = count_words

    def __post_init__(self) -> None:
        if self.name is not None and not self.name:
            raise ValueError("a completion model's name must not be empty")


def completion_model_of(servable: Servable[Any, Any]) -> CompletionModel | None:
    """The servable's :class:`CompletionModel` declaration, or None."""
    declared = getattr(servable, COMPLETION_MODEL_ATTRIBUTE, None)
    return declared if isinstance(declared, CompletionModel) else None


# -- generating -------------------------------------------------------------------


@dataclass(frozen=True)
class TextGenerator:
    """One text-generating servable: how a prompt becomes its item, a chunk text."""

    servable: StreamingServable[Any, Any]
    declared: CompletionModel
    make_item: Callable[[Generation], Any]

    def items(self, asked: Asked) -> list[Any]:
        """The items of every choice, in the order of their index (400 for one its
        item type refuses, or for more than :data:`MAX_INPUTS` of them)."""
        asking = len(asked.prompts) * asked.n
        if asking > MAX_INPUTS:
            raise OpenAIError(
                400,
                f"a request may ask for at most {MAX_INPUTS} choices (prompts x n), not {asking}",
                param="n",
            )
        items = []
        for prompt in asked.prompts:
            try:
                item = self.make_item(Generation(prompt, asked.max_tokens, asked.temperature))
            except (msgspec.ValidationError, ValueError) as error:
                message = str(error)
                raise OpenAIError(400, message, param=param_of(message)) from None
            items += [item] * asked.n
        return items

    async def open(
        self, items: list[Any], deadline: float | None, first: float | None, traced: Traced
    ) -> Choices:
        """Open one stream per item (none, if one is refused: overload is 503), each
        under a span of its own when ``traced`` gives a tracer."""
        if traced.tracer is None:
            return self.open_now(items, deadline, first)
        streams: list[AsyncIterator[Any]] = []
        open_stream = self.servable.stream
        try:
            for item in items:
                span = traced.tracer.stream_span(traced.path, traced.headers)
                streams.append(
                    span.open(open_stream, item, deadline=deadline, first_chunk_deadline=first)
                )
        except BaseException:
            for stream in streams:
                await stop_reading(stream)
            raise
        return Choices(streams, self.declared.chunk_text)

    def open_now(self, items: list[Any], deadline: float | None, first: float | None) -> Choices:
        """Open one stream per item at once, untraced (none, if one is refused: the
        streams opened already are left)."""
        streams: list[AsyncIterator[Any]] = []
        open_stream = self.servable.stream
        try:
            for item in items:
                streams.append(open_stream(item, deadline=deadline, first_chunk_deadline=first))
        except BaseException:
            for stream in streams:
                leave = getattr(stream, "leave", None)  # one not yet read needs nothing
                if leave is not None:
                    leave()
            raise
        return Choices(streams, self.declared.chunk_text)


@dataclass(frozen=True)
class Traced:
    """Where a request's streams get their spans: the app's tracer (None: not
    traced), the route's path and the request's headers (its ``traceparent``)."""

    tracer: Tracer | None
    path: str
    headers: Sequence[tuple[bytes, bytes]]


# -- routes -----------------------------------------------------------------------


def completion_routes(host: RouteHost, servables: Mapping[str, Servable[Any, Any]]) -> RouteTable:
    """``/v1/completions`` and ``/v1/chat/completions`` for those of ``servables``
    that declare a :class:`CompletionModel`; no routes when none does.

    Raises:
        TypeError: A declared text generator does not stream, or its item cannot
            be built from a prompt (no ``item``, and its item type is neither
            ``str`` nor a record with a ``str`` field ``prompt``).
        ValueError: Two text generators have the same name.
    """
    generators = text_generators(servables)
    if not generators:
        return {}
    return {
        path: ("POST", _route(host, generators, path), True)
        for path in (COMPLETIONS_PATH, CHAT_PATH)
    }


def text_generators(servables: Mapping[str, Servable[Any, Any]]) -> dict[str, TextGenerator]:
    """The text generators among ``servables``, by ``model`` name (see
    :func:`completion_routes` for what it raises)."""
    generators: dict[str, TextGenerator] = {}
    for servable in servables.values():
        declared = completion_model_of(servable)
        if declared is None:
            continue
        name = declared.name or servable.name
        if name in generators:
            raise ValueError(f"two completion models are named {name!r}")
        generators[name] = _generator(servable, declared)
    return generators


def completion_model_names(servables: Mapping[str, Servable[Any, Any]]) -> list[str]:
    """The ``model`` names of the text generators among ``servables``."""
    return [
        declared.name or servable.name
        for servable in servables.values()
        if (declared := completion_model_of(servable)) is not None
    ]


def _generator(servable: Servable[Any, Any], declared: CompletionModel) -> TextGenerator:
    if not isinstance(servable, StreamingServable) or not servable.can_stream(None):
        raise TypeError(
            f"completion model {servable.name!r} does not stream: its model must be a "
            "StepModel or have a generator predict()"
        )
    if declared.item is not None:
        return TextGenerator(servable, declared, declared.item)
    item_type = servable.input_type
    if item_type is str:
        return TextGenerator(servable, declared, lambda asked: asked.prompt)
    fields = {name: hint for name, hint, _ in record_fields(item_type) or []}
    if fields.get("prompt") is not str:
        raise TypeError(
            f"completion model {servable.name!r}: its item type must be str or a record "
            f"with a str field 'prompt' (else give CompletionModel an item), not {item_type!r}"
        )
    bounds = [name for name in ("max_tokens", "temperature") if name in fields]

    def make_item(asked: Generation) -> Any:
        given: dict[str, Any] = {"prompt": asked.prompt}
        for name in bounds:
            value = getattr(asked, name)
            if value is not None:
                given[name] = value
        return msgspec.convert(given, item_type)

    return TextGenerator(servable, declared, make_item)


def _route(host: RouteHost, generators: Mapping[str, TextGenerator], path: str) -> Handler:
    chat = path == CHAT_PATH
    tracer: Tracer | None = getattr(host, "tracer", None)  # an HttpApp's, with --otel

    async def complete(scope: Scope, receive: Receive, send: Send) -> int:
        choices: Choices | None = None
        try:
            timeout_s, body = await admitted_body(host, scope, receive)
            first_s = first_chunk_timeout_from(header(scope, FIRST_CHUNK_TIMEOUT_HEADER))
            asked, generator = asked_of(generators, body, chat)
            items = generator.items(asked)
            deadline = deadline_from(timeout_s)
            traced = Traced(tracer, path, scope["headers"])
            first = deadline_from(first_s, deadline)
            choices = await generator.open(items, deadline, first, traced)
            answer = new_answer(asked, generator.declared)
            if asked.stream:
                told = noted()
                if told is not None:  # its head tells the wait for the first chunk
                    told.stream = True
                opened = streamed(answer, choices, generator.declared.chunk_text)
                return await send_stream(scope, receive, send, opened.chunks, opened.framing)
            reply = await until_disconnect(
                scope, receive, whole_answer(answer, choices, len(items))
            )
        except (ClientGone, ClientDisconnected):
            return CLIENT_CLOSED
        except Exception as error:
            return await send_error(send, error, "chat completions" if chat else "completions")
        finally:
            if choices is not None:
                await choices.close()
        await send_response(send, 200, reply, _JSON)
        return 200

    return complete


# -- one request, either way ----------------------------------------------------------


def asked_of(
    generators: Mapping[str, TextGenerator], body: bytes, chat: bool
) -> tuple[Asked, TextGenerator]:
    """A request's body, decoded and checked (a chat's prompt made from its messages),
    and the text generator it names.

    Raises:
        OpenAIError: The body is malformed or asks what this server does not do (400),
            or names no model of this server (404).
    """
    messages: list[ChatMessage] = []
    if chat:
        asked, messages = chat_asked(body)
    else:
        asked = completion_asked(body)
    generator = generators.get(asked.model)
    if generator is None:
        raise unknown_model(asked.model, generators)
    if chat:
        asked = replace(asked, prompts=[generator.declared.chat_template(messages)])
    return asked, generator


def new_answer(asked: Asked, declared: CompletionModel) -> Answer:
    """A new answer to ``asked``: its own id, the time it was made, the prompt's tokens."""
    return Answer(
        asked,
        ("chatcmpl-" if asked.chat else "cmpl-") + secrets.token_hex(12),
        int(time.time()),
        sum(map(declared.count_tokens, asked.prompts)),
    )


def streamed(answer: Answer, choices: Choices, chunk_text: Callable[[Any], str]) -> OpenedStream:
    """How a streamed answer is written: a request's one choice with no stop sequence
    straight from its stream (a step's chunks for many requests in one go, without
    waking each request's task); else the events of its choices' pieces as they come,
    the choices closed at their end."""
    asked = answer.asked
    only = choices.streams[0]
    leave = getattr(only, "leave", None)  # a Service's own stream (not traced)
    if len(choices.streams) == 1 and not asked.stops and leave is not None:
        return OpenedStream(only, answer.one_choice_framing(chunk_text, leave))
    events = answer.events(choices.pieces(asked.stops, asked.max_tokens))
    return OpenedStream(_closing(events, choices), OPENAI_SSE)


async def _closing(events: AsyncIterator[bytes], choices: Choices) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield event
    finally:
        await choices.close()
