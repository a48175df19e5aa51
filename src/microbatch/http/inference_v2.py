"""The Open Inference Protocol v2 over REST (KServe v2, Triton's HTTP API).

Routes, for the models given (one app: its one service)::

    GET  /v2                          server metadata
    GET  /v2/health/live              200 while the process is up
    GET  /v2/health/ready             200 when every model is ready, else 503
    GET  /v2/models/{name}            model metadata (inputs, outputs)
    GET  /v2/models/{name}/ready      200 when the model is ready, else 503
    POST /v2/models/{name}/infer      inference

(each ``/v2/models/{name}...`` route also under ``/versions/1``; Triton's generate
extension, plain JSON in and out, is :mod:`.generate`). Tensor data is
JSON or binary: with the binary tensor data extension (what ``tritonclient`` sends),
the body is the JSON request, ``Inference-Header-Content-Length`` bytes long,
followed by each binary input's raw bytes (``parameters.binary_data_size``), and
outputs asked for with ``binary_data`` (or all, with ``binary_data_output``) come
back the same way. Errors are ``{"error": "..."}`` with the status of
:mod:`microbatch.http.status`: a tensor that does not match gives 400 with the reason.
A request's deadline is the app's (``X-Request-Timeout-Ms`` lowers it), lowered by
the request's ``parameters.timeout`` (microseconds, as Triton reads it).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .. import __version__
from ..inference import InferenceModel
from ..tensors import Tensor, TensorError, from_json, from_raw, to_json_data, to_raw
from ..types import deadline_from
from .asgi import Receive, Scope, Send, header, send_response
from .routing import (
    CLIENT_CLOSED,
    ClientGone,
    Handler,
    RouteHost,
    RouteTable,
    admitted_body,
    until_disconnect,
)
from .server_timing import note_error
from .status import NotReady, error_reply

__all__ = ["BINARY_HEADER", "send_v2_error", "v2_routes"]

logger = logging.getLogger("microbatch.http")

BINARY_HEADER = b"inference-header-content-length"
"""The length of the JSON part of a body with binary tensor data."""

_JSON = b"application/json"
_OCTETS = b"application/octet-stream"


class _Input(msgspec.Struct):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    data: Any = None


class _Output(msgspec.Struct):
    name: str
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


class _Request(msgspec.Struct):
    inputs: list[_Input]
    id: str | None = None
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    outputs: list[_Output] = msgspec.field(default_factory=list)


class _OutputBody(msgspec.Struct, omit_defaults=True):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any] | None = None
    parameters: dict[str, Any] | None = None


class _Response(msgspec.Struct, omit_defaults=True):
    model_name: str
    outputs: list[_OutputBody]
    model_version: str = "1"
    id: str | None = None


class _ErrorBody(msgspec.Struct):
    error: str


_decode_request = msgspec.json.Decoder(_Request).decode
_encode = msgspec.json.Encoder().encode


def v2_routes(
    host: RouteHost, models: Mapping[str, InferenceModel], extensions: Sequence[str] = ()
) -> RouteTable:
    """The v2 route table of ``models`` (by name), mounted on ``host``; the server
    metadata lists ``extensions`` (those whose routes the caller mounts beside these,
    such as :mod:`.generate`'s) after ``binary_tensor_data``."""
    metadata_body = _encode(
        {
            "name": "microbatch",
            "version": __version__,
            "extensions": ["binary_tensor_data", *extensions],
        }
    )

    async def server_metadata(scope: Scope, receive: Receive, send: Send) -> int:
        await send_response(send, 200, metadata_body, _JSON)
        return 200

    async def live(scope: Scope, receive: Receive, send: Send) -> int:
        await send_response(send, 200, b'{"live":true}', _JSON)
        return 200

    async def ready(scope: Scope, receive: Receive, send: Send) -> int:
        if host.draining or not all(model.ready for model in models.values()):
            return await send_v2_error(send, NotReady("not every model is ready"))
        await send_response(send, 200, b'{"ready":true}', _JSON)
        return 200

    table: RouteTable = {
        "/v2": ("GET", server_metadata, True),
        "/v2/health/live": ("GET", live, False),
        "/v2/health/ready": ("GET", ready, False),
    }
    for name, model in models.items():
        for base in (f"/v2/models/{name}", f"/v2/models/{name}/versions/1"):
            table[base] = ("GET", _metadata(model), True)
            table[f"{base}/ready"] = ("GET", _model_ready(host, model), False)
            table[f"{base}/infer"] = ("POST", _infer(host, model), True)
    return table


def _metadata(model: InferenceModel) -> Handler:
    body = msgspec.json.encode(model.metadata())

    async def metadata(scope: Scope, receive: Receive, send: Send) -> int:
        await send_response(send, 200, body, _JSON)
        return 200

    return metadata


def _model_ready(host: RouteHost, model: InferenceModel) -> Handler:
    async def model_ready(scope: Scope, receive: Receive, send: Send) -> int:
        if host.draining or not model.ready:
            return await send_v2_error(send, NotReady(f"model {model.name!r} is not ready"))
        await send_response(send, 200, b'{"ready":true}', _JSON)
        return 200

    return model_ready


def _infer(host: RouteHost, model: InferenceModel) -> Handler:
    async def infer(scope: Scope, receive: Receive, send: Send) -> int:
        timeout_s, body = await admitted_body(host, scope, receive)
        try:
            request, binary = _parse(scope, body)
            inputs = _input_tensors(request, binary)
            deadline = deadline_from(min(timeout_s, _parameter_timeout_s(request)))
            wanted = [output.name for output in request.outputs]
            outputs = await until_disconnect(
                scope, receive, model.infer(inputs, deadline=deadline, outputs=wanted)
            )
            reply, length = _reply(model.name, request, outputs)
        except ClientGone:
            return CLIENT_CLOSED
        except Exception as error:
            return await send_v2_error(send, error)
        extra = [] if length is None else [(BINARY_HEADER, str(length).encode())]
        await send_response(send, 200, reply, _JSON if length is None else _OCTETS, extra)
        return 200

    return infer


def _parse(scope: Scope, body: bytes) -> tuple[_Request, memoryview]:
    """The JSON request and the binary part after it."""
    declared = header(scope, BINARY_HEADER)
    length = len(body)
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            length = -1
        if not 0 <= length <= len(body):
            raise TensorError("Inference-Header-Content-Length is not a length within the body")
    view = memoryview(body)
    try:
        return _decode_request(view[:length]), view[length:]
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise TensorError(f"the request is not a v2 inference request: {error}") from None


def _input_tensors(request: _Request, binary: memoryview) -> list[Tensor]:
    tensors = []
    offset = 0
    for given in request.inputs:
        size = given.parameters.get("binary_data_size")
        if size is None:
            if given.data is None:
                raise TensorError(f"input {given.name!r} has neither data nor binary_data_size")
            tensors.append(from_json(given.name, given.datatype, given.shape, given.data))
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TensorError(f"input {given.name!r}: binary_data_size is not a byte count")
        if offset + size > len(binary):
            raise TensorError(f"input {given.name!r}: the body ends before its binary data")
        raw = binary[offset : offset + size]
        offset += size
        tensors.append(from_raw(given.name, given.datatype, given.shape, raw))
    if offset != len(binary):
        raise TensorError(f"{len(binary) - offset} bytes of binary data belong to no input")
    return tensors


def _parameter_timeout_s(request: _Request) -> float:
    microseconds = request.parameters.get("timeout")
    if microseconds is None:
        return math.inf
    if isinstance(microseconds, bool) or not isinstance(microseconds, (int, float)):
        raise TensorError("parameters.timeout must be a number of microseconds")
    if not microseconds > 0:
        raise TensorError("parameters.timeout must be > 0 microseconds")
    return float(microseconds) / 1e6


def _reply(name: str, request: _Request, outputs: list[Tensor]) -> tuple[bytes, int | None]:
    """The response body, and the length of its JSON part when binary data follows."""
    all_binary = bool(request.parameters.get("binary_data_output", False))
    binary_names = {
        output.name for output in request.outputs if output.parameters.get("binary_data", False)
    }
    bodies = []
    blobs = []
    for tensor in outputs:
        if all_binary or tensor.name in binary_names:
            raw = to_raw(tensor)
            blobs.append(raw)
            parameters = {"binary_data_size": len(raw)}
            bodies.append(_OutputBody(tensor.name, tensor.datatype, tensor.shape, None, parameters))
        else:
            data = to_json_data(tensor)
            bodies.append(_OutputBody(tensor.name, tensor.datatype, tensor.shape, data))
    head = _encode(_Response(name, bodies, id=request.id))
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)


async def send_v2_error(send: Send, error: BaseException) -> int:
    """Send ``{"error": message}`` with the error's status (see
    :func:`~.status.error_reply`); return the status."""
    reply = error_reply(error)
    note_error(reply.error)  # its Server-Timing names it
    if reply.status >= 500 and reply.status not in (503, 504):
        logger.error("v2 inference failed: %s", reply.message, exc_info=error)
    body = _encode(_ErrorBody(reply.message))
    await send_response(send, reply.status, body, _JSON, reply.headers)
    return reply.status
