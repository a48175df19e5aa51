"""The Open Inference Protocol v2 over gRPC (``grpc.aio``), on the same servables as
the HTTP app.

ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and ModelInfer of
``inference.GRPCInferenceService``, and ModelStreamInfer, the protocol's streaming
extension as Triton defines it (many requests on one call; a model that streams
answers with one response per chunk: see :mod:`microbatch.grpc.stream_call`). A
call's gRPC deadline and a request's ``timeout`` parameter (microseconds), capped by
the default timeout, become its items' deadline; the bearer token is the ``authorization``
metadata (``Bearer <token>``), required on every method but the health probes;
messages are bounded by ``max_message_bytes``; errors map as
:func:`~microbatch.grpc.status.grpc_status` says. With a tracer, each ModelInfer
call is a span (a child of the W3C ``traceparent`` in its metadata) over its items'
stage spans and batch links, as for HTTP (see :mod:`microbatch.tracing`), and each
request of a ModelStreamInfer call a ``ModelStreamInfer`` span (a stream's with its
chunk count, as an HTTP stream's).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from .. import __version__
from ..http.status import NotReady
from ..inference import InferenceModel
from ..streams import stop_reading
from ..tensors import Tensor, TensorError, from_json, from_raw, to_raw
from ..timing import Timing
from ..types import deadline_from
from .messages import SERVICE, message
from .status import grpc_status
from .stream_call import Send, StreamCall

if TYPE_CHECKING:
    from ..tracing import Tracer

__all__ = ["GrpcConfig", "GrpcServer"]

logger = logging.getLogger("microbatch.grpc")

_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""Where each datatype's typed (not raw) contents are (FP16 comes only raw)."""


@dataclass(frozen=True)
class GrpcConfig:
    """Settings of the gRPC server.

    Args:
        host: Address to bind (loopback by default).
        port: Port to bind; 0 picks a free one.
        max_message_bytes: Largest request and response message.
        default_timeout_s: A call's deadline when the client sets none (or a later one).
        auth_token: When set, every method but the health probes needs the
            ``authorization: Bearer <token>`` metadata.
        graceful_timeout_s: On shutdown, longest wait for calls in flight.
        max_stream_requests: The most requests of one ModelStreamInfer call in
            flight at once (the call is read no further until one ends).
        max_stream_responses: The most responses of one ModelStreamInfer call
            waiting to be sent (the requests making more wait).

    Raises:
        ValueError: A setting is out of range.
    """

    host: str = "127.0.0.1"
    port: int = 8001
    max_message_bytes: int = 10 * 1024 * 1024
    default_timeout_s: float = 30.0
    auth_token: str | None = None
    graceful_timeout_s: float = 30.0
    max_stream_requests: int = 1024
    max_stream_responses: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an int in 0..65535, got {self.port!r}")
        for name in ("max_message_bytes", "max_stream_requests", "max_stream_responses"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("default_timeout_s", "graceful_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.auth_token is not None and not self.auth_token:
            raise ValueError("auth_token must be None or a non-empty string")


_Method = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class GrpcServer:
    """The v2 gRPC service of some models, on a ``grpc.aio`` server.

    Its lifecycle is explicit: :meth:`start` binds and serves (the models must be
    started already), :meth:`begin_draining` refuses new inference,
    :meth:`stop` finishes the calls in flight and closes.

    Args:
        models: The served models by name.
        config: Address, limits, timeout and token.
        tracer: Trace each ModelInfer call (see :mod:`microbatch.tracing`), or None.
    """

    def __init__(
        self,
        models: Mapping[str, InferenceModel],
        config: GrpcConfig,
        tracer: Tracer | None = None,
    ) -> None:
        self.models = dict(models)
        self.config = config
        self.tracer = tracer
        self.port: int | None = None
        self._draining = False
        self._server: grpc.aio.Server | None = None
        token = config.auth_token
        self._authorization = None if token is None else f"Bearer {token}"

    @property
    def draining(self) -> bool:
        """Shutdown has begun: readiness is false and inference is refused."""
        return self._draining

    def begin_draining(self) -> None:
        """Turn readiness off and refuse new inference (``UNAVAILABLE``)."""
        self._draining = True

    async def start(self) -> int:
        """Bind and serve; return the port bound.

        Raises:
            OSError: The address cannot be bound.
        """
        limit = self.config.max_message_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", 0),
            ]
        )
        server.add_generic_rpc_handlers((self._handler(),))
        address = f"{self.config.host}:{self.config.port}"
        try:
            port: int = server.add_insecure_port(address)
        except RuntimeError as error:
            raise OSError(f"cannot bind gRPC to {address}: {error}") from None
        await server.start()
        self._server, self.port = server, port
        return port

    async def stop(self) -> None:
        """Refuse new calls, wait for those in flight (up to the graceful timeout),
        close."""
        self._draining = True
        if self._server is not None:
            await self._server.stop(self.config.graceful_timeout_s)
            self._server = None

    # -- methods -------------------------------------------------------------------

    def _handler(self) -> grpc.GenericRpcHandler:
        methods: dict[str, tuple[_Method, str, str, bool]] = {
            "ServerLive": (self._server_live, "ServerLiveRequest", "ServerLiveResponse", False),
            "ServerReady": (self._server_ready, "ServerReadyRequest", "ServerReadyResponse", False),
            "ModelReady": (self._model_ready, "ModelReadyRequest", "ModelReadyResponse", False),
            "ServerMetadata": (
                self._server_metadata,
                "ServerMetadataRequest",
                "ServerMetadataResponse",
                True,
            ),
            "ModelMetadata": (
                self._model_metadata,
                "ModelMetadataRequest",
                "ModelMetadataResponse",
                True,
            ),
            "ModelInfer": (self._model_infer, "ModelInferRequest", "ModelInferResponse", True),
        }
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                self._guarded(method, protected),
                request_deserializer=message(request).FromString,
                response_serializer=message(response).SerializeToString,
            )
            for name, (method, request, response, protected) in methods.items()
        }
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self._model_stream_infer,
            request_deserializer=message("ModelInferRequest").FromString,
            response_serializer=message("ModelStreamInferResponse").SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        """Abort the call (``UNAUTHENTICATED``) unless it has the token, when one is set."""
        if self._authorization is not None:
            given = dict(context.invocation_metadata() or ()).get("authorization", "")
            if not hmac.compare_digest(str(given), self._authorization):
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "a bearer token is required (authorization: Bearer <token>)",
                )

    def _guarded(self, method: _Method, protected: bool) -> _Method:
        """``method`` behind the token (when ``protected``), its errors as statuses."""

        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if protected:
                await self._authorize(context)
            try:
                return await method(request, context)
            except Exception as error:
                code, text = grpc_status(error)
                if code == grpc.StatusCode.INTERNAL:
                    logger.error("gRPC %s failed: %s", type(request).__name__, text, exc_info=error)
                await context.abort(code, text)

        return guarded

    async def _server_live(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return message("ServerLiveResponse")(live=True)

    async def _server_ready(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        ready = not self._draining and all(model.ready for model in self.models.values())
        return message("ServerReadyResponse")(ready=ready)

    async def _model_ready(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        model = self.models.get(request.name)
        ready = model is not None and model.ready and not self._draining
        return message("ModelReadyResponse")(ready=ready)

    async def _server_metadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return message("ServerMetadataResponse")(
            name="microbatch", version=__version__, extensions=["binary_tensor_data"]
        )

    async def _model_metadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        metadata = self._model(request.name).metadata()
        reply = message("ModelMetadataResponse")(
            name=metadata.name, versions=metadata.versions, platform=metadata.platform
        )
        for listed, tensors in ((reply.inputs, metadata.inputs), (reply.outputs, metadata.outputs)):
            for tensor in tensors:
                listed.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        return reply

    async def _model_infer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        model = self._model(request.model_name)
        if self._draining:
            raise NotReady("the server is shutting down")
        outputs = await self._infer(model, request, context)
        return _reply(model.name, request.id, outputs)

    async def _model_stream_infer(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        await self._authorize(context)
        if self._draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")

        async def answer(request: Any, send: Send) -> None:
            await self._answer_streamed(request, context, send)

        call = StreamCall(
            answer,
            max_requests=self.config.max_stream_requests,
            max_responses=self.config.max_stream_responses,
        )
        # the call's end (a client that left, a deadline) cancels what is in flight
        # at once, whether or not grpc.aio closes this generator
        context.add_done_callback(lambda _: call.cancel())
        responses = call.responses(requests)
        async with contextlib.aclosing(responses):
            async for response in responses:
                yield response

    async def _answer_streamed(
        self, request: Any, context: grpc.aio.ServicerContext, send: Send
    ) -> None:
        """Answer one request of a ModelStreamInfer call: one response, or one a
        chunk for a model that streams (then an empty last one when the request asks
        for it); its error as its last response."""
        try:
            model = self._model(request.model_name)
            if self._draining:
                raise NotReady("the server is shutting down")
            if "sequence_id" in request.parameters:
                raise TensorError("sequence batching (the sequence_id parameter) is not supported")
            if not model.streams:
                outputs = await self._infer(model, request, context, "ModelStreamInfer")
                await send(_streamed(_reply(model.name, request.id, outputs), final=True))
                return
            inputs = _input_tensors(request)
            wanted = [output.name for output in request.outputs]
            deadline = self._deadline(request, context)
            traced = None
            if self.tracer is not None:
                headers = _trace_headers(context)
                traced = self.tracer.named_stream_span("ModelStreamInfer", headers)
            chunks = model.stream(inputs, deadline=deadline, outputs=wanted, traced=traced)
            try:
                async for tensors in chunks:
                    await send(_streamed(_reply(model.name, request.id, tensors), final=False))
            finally:  # even when cancelled while a response waits for room: the item
                await stop_reading(chunks)  # leaves now, not when the collector finds it
            wants_end = request.parameters.get("triton_enable_empty_final_response")
            if wants_end is not None and wants_end.bool_param:
                await send(_streamed(_reply(model.name, request.id, []), final=True))
        except Exception as error:
            code, text = grpc_status(error)
            if code == grpc.StatusCode.INTERNAL:
                logger.error("gRPC stream request failed: %s", text, exc_info=error)
            failed = _streamed(_reply(request.model_name, request.id, []), final=True)
            failed.error_message = text
            await send(failed)

    async def _infer(
        self,
        model: InferenceModel,
        request: Any,
        context: grpc.aio.ServicerContext,
        span_name: str = "ModelInfer",
    ) -> list[Tensor]:
        """A request's output tensors (a span ``span_name`` when there is a tracer)."""
        deadline = self._deadline(request, context)
        inputs = _input_tensors(request)
        wanted = [output.name for output in request.outputs]
        tracer = self.tracer
        if tracer is None:
            return await model.infer(inputs, deadline=deadline, outputs=wanted)
        timing = Timing(time.monotonic(), told=False)
        tracer.start_request(timing, span_name, _trace_headers(context))
        infer = model.infer(inputs, deadline=deadline, outputs=wanted, timing=timing)
        outputs: list[Tensor] = await tracer.traced(infer, timing)
        return outputs

    def _deadline(self, request: Any, context: grpc.aio.ServicerContext) -> float | None:
        """A request's deadline: the default timeout, or sooner the call's gRPC
        deadline or the request's ``timeout`` parameter (microseconds, as Triton's)."""
        timeout_s = self.config.default_timeout_s
        remaining = context.time_remaining()
        if remaining is not None:
            timeout_s = max(0.0, min(timeout_s, remaining))
        given = request.parameters.get("timeout")
        if given is not None and given.int64_param > 0:
            timeout_s = min(timeout_s, given.int64_param / 1e6)
        return deadline_from(timeout_s)

    def _model(self, name: str) -> InferenceModel:
        model = self.models.get(name)
        if model is None:
            raise _UnknownModel(f"no model {name!r}; this server has {sorted(self.models)}")
        return model


def _reply(model_name: str, request_id: str, outputs: list[Tensor]) -> Any:
    """A ModelInferResponse of ``outputs`` (as raw contents)."""
    reply = message("ModelInferResponse")(model_name=model_name, model_version="1", id=request_id)
    for tensor in outputs:
        reply.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        reply.raw_output_contents.append(to_raw(tensor))
    return reply


def _streamed(reply: Any, *, final: bool) -> Any:
    """``reply`` as a ModelStreamInfer response, saying whether it is its request's last."""
    reply.parameters["triton_final_response"].bool_param = final
    return message("ModelStreamInferResponse")(infer_response=reply)


def _trace_headers(context: grpc.aio.ServicerContext) -> list[tuple[bytes, bytes]]:
    """The call's ``traceparent`` and ``tracestate`` metadata, as header pairs."""
    return [
        (key.encode("latin-1"), value.encode("latin-1"))
        for key, value in context.invocation_metadata() or ()
        if key in ("traceparent", "tracestate") and isinstance(value, str)
    ]


class _UnknownModel(TensorError):
    http_status = 404


def _input_tensors(request: Any) -> list[Tensor]:
    """The request's inputs, from ``raw_input_contents`` or each input's contents."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise TensorError(
            f"{len(request.inputs)} inputs but {len(raw)} raw_input_contents; give one each"
        )
    tensors = []
    for index, given in enumerate(request.inputs):
        shape = list(given.shape)
        if raw:
            tensors.append(from_raw(given.name, given.datatype, shape, raw[index]))
            continue
        field = _CONTENTS.get(given.datatype)
        if field is None:
            raise TensorError(f"input {given.name!r}: {given.datatype} data must be raw")
        values = list(getattr(given.contents, field))
        tensors.append(from_json(given.name, given.datatype, shape, values))
    return tensors
