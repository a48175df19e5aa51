"""The OpenAI completion routes' streams without ASGI: ``POST /v1/completions`` and
``POST /v1/chat/completions`` with ``"stream": true``, for ``microbatch serve``'s
connection layer, as :class:`~.stream_route.StreamRoute` is for ``/stream``.

The connection layer checks a request's headers here, reads its body, opens its
streams here and writes their events itself (:mod:`microbatch.serve.stream_path`).
A request this route does not take goes whole to the ASGI route
(:mod:`.completions`), which answers it as it always did: one whose headers fail a
check, one that asks for no stream or is malformed, and every request of a traced
app (its streams get spans there). So the answers are the same either way; here
only the servable's refusal to open a stream (overload, shutting down) and a
stream's error before its first chunk are answered, OpenAI's way as there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import msgspec

from ..types import deadline_from
from .codecs import JSON
from .completions import CHAT_PATH, TextGenerator, asked_of, new_answer, streamed
from .openai_errors import error_body
from .predict import BodyRoute, ErrorAnswer, HeaderMap, RawHeaders, RouteSettings, check_body_length
from .stream_route import OpenedStream
from .streams import FIRST_CHUNK_TIMEOUT_HEADER, first_chunk_timeout_from

__all__ = ["CompletionStream", "Deadlines"]

_encode = msgspec.json.Encoder().encode


class Deadlines(NamedTuple):
    """A completion request's deadlines, from its headers: the whole answer's, and
    its first chunk's."""

    whole: float | None
    first_chunk: float | None


class CompletionStream(BodyRoute):
    """``/v1/completions`` or ``/v1/chat/completions`` as the connection layer
    answers a streamed request (a :class:`~.stream_route.NativeStreamRoute`).

    Args:
        generators: The app's text generators, by ``model`` name.
        path: The route's path (its label in metrics).
        settings: The app's route settings (bearer token, limits, request ids).
    """

    __slots__ = ("_chat", "_generators", "_what")

    def __init__(
        self, generators: Mapping[str, TextGenerator], path: str, settings: RouteSettings
    ) -> None:
        super().__init__(settings)
        self._generators = generators
        self._chat = path == CHAT_PATH
        self._what = "chat completions" if self._chat else "completions"  # in its error log

    def check(self, headers: HeaderMap) -> Deadlines | None:
        """The request's deadlines, or None where the ASGI route takes it: a header
        fails a check (it answers that), or the app traces requests."""
        if self._tracer is not None:
            return None
        get = headers.get
        try:
            deadline = self._deadline(get, authorize=True)
            first_s = first_chunk_timeout_from(get(FIRST_CHUNK_TIMEOUT_HEADER))
            check_body_length(get(b"content-length"), self.max_body_bytes)
        except Exception:
            return None
        return Deadlines(deadline, deadline_from(first_s, deadline))

    def open(self, checked: Deadlines, body: bytes, headers: RawHeaders) -> OpenedStream | None:
        """Open the streams of a request that asks for them, or None where the ASGI
        route takes the request: it does not stream, or it is refused before any
        stream opens (malformed, an unknown model, too many choices).

        Raises:
            Exception: The servable refused a stream (overload: 503, ...).
        """
        try:
            asked, generator = asked_of(self._generators, body, self._chat)
            items = generator.items(asked)
        except Exception:
            return None
        if not asked.stream:
            return None
        choices = generator.open_now(items, checked.whole, checked.first_chunk)
        answer = new_answer(asked, generator.declared)
        return streamed(answer, choices, generator.declared.chunk_text)

    def error_answer(self, error: Exception, accept: bytes | None, request_id: str) -> ErrorAnswer:
        """``error`` OpenAI's way, as the ASGI route answers it."""
        status, body, headers = error_body(error, self._what)
        name = body["error"]["code"] or body["error"]["type"]
        return ErrorAnswer(status, _encode(body), JSON.media_type, headers, name)
