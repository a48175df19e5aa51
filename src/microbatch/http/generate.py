"""Triton's generate extension on the v2 REST front: plain JSON in and out, for the
LLM tooling (and curl users) that speak it rather than tensors.

Routes, for each model served under v2 (each also under ``/versions/1``)::

    POST /v2/models/{name}/generate         one JSON answer
    POST /v2/models/{name}/generate_stream  Server-Sent Events, one per chunk

The body is a JSON object of the model's inputs by name, each a plain value (a
scalar, or a list for one row of a tensor: no ``datatype`` or ``shape``), and
optionally ``"parameters"``, an object that is ignored (never an input). The row
becomes the item as ``/infer`` makes it (see
:meth:`~microbatch.inference.InferenceModel.row_item`), so an unknown or missing
input, or a value the item type refuses, is 400 with the reason.

The answer is ``{"model_name", "model_version", <output>: value, ...}``, the outputs
named as ``/infer`` names them (see :func:`~microbatch.inference.output_values`). For
a model that streams, ``generate`` joins the whole stream into that one answer: an
output whose every chunk is text is the texts concatenated; any other output is the
list of its chunks' values, in order. ``generate_stream`` sends each chunk the moment
it is made as ``data: {"model_name", "model_version", <outputs of the chunk>}``; a
model that does not stream answers one such event. An error before the first event
is the usual v2 error (``{"error": "..."}`` with its status: 504 for a passed
deadline, 503 for overload); an error after it is a last ``data: {"error": "..."}``
event. A client that disconnects leaves the stream: its slot is freed at the next
step. Deadline header, token, body limits and draining are the other v2 routes'.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec

from ..inference import InferenceModel, output_values
from ..streams import stop_reading
from ..tensors import TensorError
from ..types import deadline_from
from .asgi import Receive, Scope, Send, send_response
from .codecs import encode_hook
from .inference_v2 import send_v2_error
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
from .status import UnencodableResult
from .streams import Framing, send_stream

__all__ = ["GENERATE_EXTENSION", "generate_routes"]

GENERATE_EXTENSION = "generate"
"""The extension's name, as the v2 server metadata lists it."""

_JSON = b"application/json"
_PARAMETERS = "parameters"
_encode = msgspec.json.Encoder(enc_hook=encode_hook).encode
_decode_body = msgspec.json.Decoder(dict[str, Any]).decode
_UNENCODABLE = (TypeError, ValueError, NotImplementedError, OverflowError)


def generate_routes(host: RouteHost, models: Mapping[str, InferenceModel]) -> RouteTable:
    """``generate`` and ``generate_stream`` for each of ``models`` (by name), mounted
    on ``host`` beside :func:`~.inference_v2.v2_routes` (which should then list
    :data:`GENERATE_EXTENSION`)."""
    table: RouteTable = {}
    for name, model in models.items():
        answer, stream = _generate(host, model), _generate_stream(host, model)
        for base in (f"/v2/models/{name}", f"/v2/models/{name}/versions/1"):
            table[f"{base}/generate"] = ("POST", answer, True)
            table[f"{base}/generate_stream"] = ("POST", stream, True)
    return table


def _generate(host: RouteHost, model: InferenceModel) -> Handler:
    head = {"model_name": model.name, "model_version": "1"}

    async def generate(scope: Scope, receive: Receive, send: Send) -> int:
        timeout_s, body = await admitted_body(host, scope, receive)
        try:
            item = model.row_item(_named_values(body))
            answer = await until_disconnect(
                scope, receive, _whole_answer(model, item, deadline_from(timeout_s))
            )
            reply = _encoded({**head, **answer})
        except ClientGone:
            return CLIENT_CLOSED
        except Exception as error:
            return await send_v2_error(send, error)
        await send_response(send, 200, reply, _JSON)
        return 200

    return generate


def _generate_stream(host: RouteHost, model: InferenceModel) -> Handler:
    framing = _sse(model.name)

    async def generate_stream(scope: Scope, receive: Receive, send: Send) -> int:
        timeout_s, body = await admitted_body(host, scope, receive)
        try:
            item = model.row_item(_named_values(body))
            deadline = deadline_from(timeout_s)
            if model.streams:
                chunks = model.open_stream(item, deadline=deadline)
                told = noted()
                if told is not None:  # its head tells the wait for the first chunk
                    told.stream = True
            else:
                chunks = _one_result(model, item, deadline)
            return await send_stream(scope, receive, send, chunks, framing)
        except Exception as error:  # before the first event: nothing was sent
            return await send_v2_error(send, error)

    return generate_stream


def _named_values(body: bytes) -> dict[str, Any]:
    """The request's values by input name (its ``parameters`` left out).

    Raises:
        TensorError: The body is not a JSON object (400).
    """
    try:
        values = _decode_body(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise TensorError(
            f"a generate request is a JSON object of inputs by name: {error}"
        ) from None
    values.pop(_PARAMETERS, None)
    return values


async def _whole_answer(model: InferenceModel, item: Any, deadline: float | None) -> dict[str, Any]:
    """The item's outputs; for a model that streams, its whole stream joined."""
    if not model.streams:
        return output_values(await model.servable.submit(item, deadline=deadline))
    by_name: dict[str, list[Any]] = {}
    chunks = model.open_stream(item, deadline=deadline)
    try:
        async for chunk in chunks:
            for name, value in output_values(chunk).items():
                by_name.setdefault(name, []).append(value)
    finally:
        await stop_reading(chunks)  # a client gone, or an error: the item leaves
    return {name: _joined(values) for name, values in by_name.items()}


def _joined(values: list[Any]) -> Any:
    """One output's chunks as one value: texts concatenated, else the list of them."""
    if all(isinstance(value, str) for value in values):
        return "".join(values)
    return values


async def _one_result(
    model: InferenceModel, item: Any, deadline: float | None
) -> AsyncIterator[Any]:
    """The result of a model that does not stream, as a stream of one chunk."""
    yield await model.servable.submit(item, deadline=deadline)


def _encoded(answer: dict[str, Any]) -> bytes:
    """The answer as JSON.

    Raises:
        UnencodableResult: An output JSON cannot carry (500).
    """
    try:
        return _encode(answer)
    except _UNENCODABLE as error:
        raise UnencodableResult("an output cannot be encoded as JSON") from error


def _sse(model_name: str) -> Framing:
    """The extension's Server-Sent Events for ``model_name``: ``data: {json}`` per
    chunk, nothing at the end, ``data: {"error": message}`` for an error after the
    first event."""
    head = {"model_name": model_name, "model_version": "1"}

    def chunk(value: Any) -> bytes:
        return b"data: " + _encode({**head, **output_values(value)}) + b"\n\n"

    def end(_: dict[str, Any]) -> bytes:
        return b""

    def error(reply: dict[str, Any]) -> bytes:
        return b"data: " + _encode({"error": reply["message"]}) + b"\n\n"

    return Framing("v2-generate-sse", b"text/event-stream", chunk, end, error)
