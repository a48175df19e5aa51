"""A Servable as the Open Inference Protocol v2 sees it, whatever the transport.

REST (:mod:`microbatch.http.inference_v2`) and gRPC (:mod:`microbatch.grpc`) both
read tensors off the wire and hand them to :meth:`InferenceModel.infer`: each row
becomes one item, submitted on its own (so rows from many clients share batches),
and the results become the output tensors. A model that streams (a step model, a
generator ``predict``) is also offered as :meth:`InferenceModel.stream`: one row in,
each chunk out as output tensors of one row. Triton's generate extension
(:mod:`microbatch.http.generate`) gives one row's inputs as plain JSON values
(:meth:`InferenceModel.row_item`) and answers with plain values (:func:`output_values`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import MicrobatchError
from .signature import ANY, Signature, field_values, signature_of
from .tensors import Tensor, TensorError, from_json
from .timing import Timing, accepts_timing
from .types import Servable, StreamingServable

if TYPE_CHECKING:
    from .tracing import TracedStream

__all__ = [
    "InferenceModel",
    "ModelMetadata",
    "OutputMismatch",
    "TensorMetadata",
    "chunk_tensors",
    "output_values",
    "submit_all",
]

_CHUNK = signature_of(Any, "output")
_RECORD_CHUNK = signature_of(dict[str, Any], "output")


class OutputMismatch(MicrobatchError):
    """The model's results do not fit its declared outputs (a server error)."""

    http_status = 500


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """One input or output as model metadata lists it."""

    name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """A model's v2 metadata."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


async def submit_all(
    servable: Servable[Any, Any],
    items: Sequence[Any],
    deadline: float | None,
    route: str | None = None,
    timing: Timing | None = None,
) -> list[Any]:
    """Submit every item at once and wait for all their results, in order.

    The first error is raised and the other items are cancelled (they are dropped
    before any model time is spent on them when they are still queued). With a
    traced ``timing`` (the request's record, its span started), each item gets a
    record of its own under the request's span, so its stages and batches are
    traced as the request's.
    """
    if timing is not None and timing.span is not None and accepts_timing(servable):
        submit: Any = servable.submit  # takes timing, as accepts_timing says
        submitted = [
            submit(item, deadline=deadline, route=route, timing=_item_record(timing))
            for item in items
        ]
    else:
        submitted = [servable.submit(item, deadline=deadline, route=route) for item in items]
    if len(submitted) == 1:
        return [await submitted[0]]
    tasks = [asyncio.ensure_future(one) for one in submitted]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
                task.add_done_callback(_retrieve)


def _item_record(request: Timing) -> Timing:
    """A record for one item of ``request`` (traced under its span, told nowhere)."""
    return Timing(request.start_s, span=request.span, tracer=request.tracer, told=False)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a cancelled sibling's outcome as seen (no 'never retrieved' warning)."""
    if not task.cancelled():
        task.exception()


class InferenceModel:
    """One servable's v2 view: its metadata and ``infer``.

    Args:
        servable: The served model; its declared item and result types give the
            input and output tensors (see :mod:`microbatch.signature`).
    """

    def __init__(self, servable: Servable[Any, Any]) -> None:
        self.servable = servable
        self.name = servable.name
        self.inputs: Signature = signature_of(servable.input_type, "input")
        self.outputs: Signature = signature_of(servable.output_type, "output")
        self._streaming = servable if isinstance(servable, StreamingServable) else None
        self._input_specs = {spec.name: spec for spec in self.inputs.specs}

    @property
    def ready(self) -> bool:
        """The servable takes items now."""
        return self.servable.ready

    def metadata(self) -> ModelMetadata:
        """Names, datatypes and shapes (``-1``: any length) of the inputs and outputs."""

        def listed(signature: Signature) -> list[TensorMetadata]:
            return [TensorMetadata(s.name, s.datatype, s.shape) for s in signature.specs]

        return ModelMetadata(
            self.name, ["1"], "microbatch", listed(self.inputs), listed(self.outputs)
        )

    async def infer(
        self,
        inputs: Sequence[Tensor],
        *,
        deadline: float | None,
        outputs: Sequence[str] = (),
        timing: Timing | None = None,
    ) -> list[Tensor]:
        """Each row of ``inputs`` as one item; the results as output tensors.

        Args:
            inputs: The input tensors (their first dimension is the rows).
            deadline: The request's deadline (``time.monotonic()``), or None.
            outputs: The outputs wanted, by name (empty: all).
            timing: The request's traced record (see :func:`submit_all`), or None.

        Raises:
            TensorError: The inputs do not match the model (400), an unknown output
                is asked for, or the model streams (as Triton refuses a decoupled
                model's unary call: its chunks do not make one tensor a row).
            OutputMismatch: The results do not fit the declared outputs (500).
            MicrobatchError: What ``submit`` raises (overload, deadline, ...).
        """
        if self.streams:
            raise TensorError(
                f"model {self.name!r} streams its results: ask with ModelStreamInfer"
                " (gRPC) or on its HTTP stream route"
            )
        declared = {spec.name for spec in self.outputs.specs}
        unknown = [name for name in outputs if declared and name not in declared]
        if self.outputs.open_spec is None and unknown:
            raise TensorError(f"unknown output {unknown[0]!r}; the model gives {sorted(declared)}")
        items = self.inputs.items(inputs)
        results = await submit_all(self.servable, items, deadline, timing=timing)
        try:
            tensors = self.outputs.tensors(results)
        except ValueError as error:
            raise OutputMismatch(str(error)) from None
        return _chosen(tensors, outputs)

    def row_item(self, values: Mapping[str, Any]) -> Any:
        """The one item of a request that gives each input's value by name as plain
        JSON (a scalar, or nested lists for one row of a tensor), as Triton's
        generate extension does: each value becomes one row of its input, of the
        input's declared datatype (an undeclared one takes the value's own: text
        ``BYTES``, a boolean ``BOOL``, an integer ``INT64``, any other number
        ``FP64``), and the row becomes the item as :meth:`infer` makes it.

        Raises:
            TensorError: An unknown or missing input, a value its input does not
                take, or a row the item type refuses (400 with the reason).
        """
        tensors = []
        for name, value in values.items():
            spec = self._input_specs.get(name, self.inputs.open_spec)
            datatype = spec.datatype if spec is not None else ANY
            if datatype == ANY:
                datatype = _datatype_of_value(value)
            tensors.append(from_json(name, datatype, [1, *_value_shape(value)], value))
        (item,) = self.inputs.items(tensors)
        return item

    def open_stream(self, item: Any, *, deadline: float | None) -> AsyncIterator[Any]:
        """The chunks of ``item``'s stream as the model makes them (leaving the
        iteration early withdraws the item at its next step).

        Raises:
            TypeError: The model does not stream.
            MicrobatchError: What ``stream`` raises (overload, ...).
        """
        if self._streaming is None:
            raise TypeError(f"model {self.name!r} does not stream")
        return self._streaming.stream(item, deadline=deadline)

    @property
    def streams(self) -> bool:
        """Its results come as streams of chunks: :meth:`stream`, not :meth:`infer`."""
        return self._streaming is not None and self._streaming.can_stream()

    async def stream(
        self,
        inputs: Sequence[Tensor],
        *,
        deadline: float | None,
        outputs: Sequence[str] = (),
        traced: TracedStream | None = None,
    ) -> AsyncIterator[list[Tensor]]:
        """The one row of ``inputs`` as one item; each chunk of its stream as output
        tensors (see :func:`chunk_tensors`) as it comes. Leaving the iteration early
        withdraws the item (at its next step).

        Args:
            inputs: The input tensors, of one row.
            deadline: The whole stream's deadline (``time.monotonic()``), or None.
            outputs: The outputs wanted, by name (empty: all).
            traced: The request's span (see :mod:`microbatch.tracing`), or None.

        Raises:
            TensorError: The inputs do not match the model or have more than one
                row, or a chunk lacks an output asked for.
            OutputMismatch: A chunk cannot be a tensor (500).
            MicrobatchError: What ``stream`` raises (overload, deadline, ...).
        """
        if self._streaming is None:
            raise TypeError(f"model {self.name!r} does not stream")
        items = self.inputs.items(inputs)
        if len(items) != 1:
            raise TensorError(f"a model that streams takes one row a request, got {len(items)}")
        stream = self._streaming.stream
        if traced is None:
            chunks = stream(items[0], deadline=deadline)
        else:
            chunks = traced.open(stream, items[0], deadline=deadline)
        async with contextlib.aclosing(chunks):  # type: ignore[type-var]
            async for chunk in chunks:
                yield _chosen(chunk_tensors(chunk), outputs)


def chunk_tensors(chunk: Any) -> list[Tensor]:
    """One chunk as output tensors of one row: a record (a dict, a struct, a
    dataclass) as one tensor per field that is not None, anything else as one
    tensor ``output``.

    Raises:
        OutputMismatch: The chunk cannot be a tensor.
    """
    fields = _set_fields(chunk)
    signature = _CHUNK if fields is None else _RECORD_CHUNK
    try:
        return signature.tensors([chunk if fields is None else fields])
    except ValueError as error:
        raise OutputMismatch(f"a chunk: {error}") from None


def output_values(result: Any) -> dict[str, Any]:
    """A result (or a chunk) as plain values by output name, named as
    :func:`chunk_tensors` names its tensors: a record's fields that are not None,
    anything else as ``output``."""
    fields = _set_fields(result)
    return {"output": result} if fields is None else fields


def _set_fields(value: Any) -> dict[str, Any] | None:
    """A record's fields that are not None, by name; None for what is no record."""
    try:
        fields = field_values(value)
    except ValueError:
        return None
    return {name: field for name, field in fields.items() if field is not None}


def _value_shape(value: Any) -> list[int]:
    """The shape of a plain JSON value: its nested lists' lengths (the first of each)."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _datatype_of_value(value: Any) -> str:
    """The datatype of an undeclared input from its (first) JSON value."""
    while isinstance(value, list) and value:
        value = value[0]
    if isinstance(value, str):
        return "BYTES"
    if isinstance(value, bool):
        return "BOOL"
    return "INT64" if isinstance(value, int) else "FP64"


def _chosen(tensors: list[Tensor], outputs: Sequence[str]) -> list[Tensor]:
    """The tensors named in ``outputs``, in its order (all of them when empty).

    Raises:
        TensorError: An output is not there.
    """
    if not outputs:
        return tensors
    by_name = {tensor.name: tensor for tensor in tensors}
    unknown = [name for name in outputs if name not in by_name]
    if unknown:
        raise TensorError(f"unknown output {unknown[0]!r}; the model gives {sorted(by_name)}")
    return [by_name[name] for name in outputs]
