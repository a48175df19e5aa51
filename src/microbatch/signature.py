"""A service's declared item and result types as named v2 tensors (its signature).

One row of every input tensor is one item; one row of every output tensor is one
result. How a declared type maps:

* a ``msgspec.Struct``, a dataclass or a pydantic model: one tensor per field, named
  by the field (``EmbedRequest(text: str)`` takes one ``BYTES`` input ``text``);
* ``dict[str, X]``: one tensor per key the client sends (or the model returns);
* anything else: one tensor named ``input`` (or ``output``).

A field's (or the whole item's) type gives the datatype and the shape of one row:
``float`` is ``FP32`` (FP16 and FP64 accepted) of shape ``[1]``, ``int`` is
``INT64`` (any integer type accepted), ``bool`` is ``BOOL``, ``str`` and ``bytes``
are ``BYTES``, ``list[X]`` adds a dimension of any length (``-1``), and a numpy
array type takes its declared dtype (any numeric one when undeclared) and any shape.
An undeclared type (``Any``) takes any datatype and shape; its published datatype
is ``ANY`` and an output's real datatype is read from the results.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from ._hints import declared_dtype, is_pydantic_model
from .tensors import DATATYPES, Tensor, TensorError, datatype_of

__all__ = ["ANY", "Signature", "TensorSpec", "field_values", "record_fields", "signature_of"]

_INTEGERS = frozenset(f"{sign}INT{bits}" for sign in ("", "U") for bits in (8, 16, 32, 64))
_FLOATS = frozenset({"FP16", "FP32", "FP64"})
_NUMBERS = _INTEGERS | _FLOATS | {"BOOL"}
ANY = "ANY"
"""The published datatype of an undeclared tensor."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One declared tensor.

    Attributes:
        name: The tensor's name.
        datatype: The published datatype (``ANY`` when undeclared).
        row_shape: The shape of one row; ``-1`` is any length; None is any shape.
        accepts: The datatypes taken as input (empty: any).
        text: Its rows are ``str`` (``BYTES`` decoded as UTF-8).
        scalar: One row is one value (shape ``[1]``, or no dimension at all).
        required: The item has no default for it.
        array: Its rows stay numpy arrays (a declared numpy array type).
    """

    name: str
    datatype: str
    row_shape: tuple[int, ...] | None
    accepts: frozenset[str]
    text: bool = False
    scalar: bool = False
    required: bool = True
    array: bool = False

    @property
    def shape(self) -> list[int]:
        """The published shape: any number of rows, then one row's shape."""
        return [-1, *(self.row_shape if self.row_shape is not None else (-1,))]


@dataclass(frozen=True)
class Signature:
    """How items are read from input tensors, or results written as output tensors.

    Attributes:
        item_type: The declared type.
        specs: The declared tensors (for ``dict[str, X]``: none; ``open_spec`` covers
            every name).
        fields: Items are built from named fields (else one tensor is the item).
        open_spec: For ``dict[str, X]``: the spec of every key.
    """

    item_type: Any
    specs: tuple[TensorSpec, ...]
    fields: bool
    open_spec: TensorSpec | None = None
    _by_name: dict[str, TensorSpec] = field(init=False, repr=False, compare=False)
    _required: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _pydantic: bool = field(init=False, repr=False, compare=False)
    _array_item: bool = field(init=False, repr=False, compare=False)

    # -- inputs ------------------------------------------------------------------

    def __post_init__(self) -> None:
        # looked up on every request: worked out once
        object.__setattr__(self, "_by_name", {spec.name: spec for spec in self.specs})
        required = tuple(spec.name for spec in self.specs if spec.required)
        object.__setattr__(self, "_required", required)
        object.__setattr__(self, "_pydantic", is_pydantic_model(self.item_type))
        object.__setattr__(self, "_array_item", _is_array_type(self.item_type))

    def items(self, tensors: Sequence[Tensor]) -> list[Any]:
        """One item per row of the input tensors.

        Raises:
            TensorError: An unknown or missing input, a datatype the input does not
                take, a shape that does not match, inputs with different numbers of
                rows, no rows, or rows the declared type does not accept.
        """
        if not tensors:
            raise TensorError("the request has no inputs")
        count = tensors[0].data.shape[0]
        names = [tensor.name for tensor in tensors]
        columns = []
        for tensor in tensors:
            if tensor.data.shape[0] != count:
                rows = sorted({tensor.data.shape[0] for tensor in tensors})
                raise TensorError(f"the inputs have different numbers of rows: {rows}")
            columns.append(_column(self._spec(tensor.name), tensor))
        if len(set(names)) != len(names):
            raise TensorError("an input is given twice")
        for name in self._required:
            if name not in names:
                raise TensorError(f"missing input {name!r}")
        if count == 0:
            raise TensorError("the inputs have no rows")
        convert = self._convert
        if not self.fields:
            return [convert(value) for value in columns[0]]
        if len(columns) == 1:
            (name,) = names
            return [convert({name: value}) for value in columns[0]]
        return [
            convert(dict(zip(names, values, strict=True))) for values in zip(*columns, strict=True)
        ]

    def _spec(self, name: str) -> TensorSpec:
        if self.open_spec is not None:
            return dataclasses.replace(self.open_spec, name=name)
        spec: TensorSpec | None = self._by_name.get(name)
        if spec is None:
            known = sorted(self._by_name)
            raise TensorError(f"unknown input {name!r}; the model takes {known}")
        return spec

    def _convert(self, value: Any) -> Any:
        if self._array_item and isinstance(value, np.ndarray):
            return value
        try:
            if self._pydantic:
                return self.item_type.model_validate(value)
            return msgspec.convert(value, self.item_type)
        except (msgspec.ValidationError, ValueError, TypeError) as error:
            raise TensorError(f"a row does not match the model's item: {error}") from None

    # -- outputs -----------------------------------------------------------------

    def tensors(self, results: Sequence[Any]) -> list[Tensor]:
        """The output tensors of the results of one request's rows.

        Raises:
            ValueError: The results do not match the declared type, or rows differ
                in shape (a tensor is rectangular): a server error, the model's doing.
        """
        if not self.fields:
            (spec,) = self.specs
            return [_stack(spec, list(results))]
        values = [field_values(result) for result in results]
        if self.open_spec is not None:
            names = list(values[0])
            specs = [dataclasses.replace(self.open_spec, name=name) for name in names]
        else:
            specs = list(self.specs)
        return [_stack(spec, [row[spec.name] for row in values]) for spec in specs]


def _column(spec: TensorSpec, tensor: Tensor) -> list[Any]:
    """The rows of ``tensor`` as the values of field ``spec.name``, checked."""
    if spec.accepts and tensor.datatype not in spec.accepts:
        raise TensorError(
            f"input {spec.name!r} takes {spec.datatype}, got {tensor.datatype}"
            if len(spec.accepts) == 1
            else f"input {spec.name!r} takes one of {sorted(spec.accepts)}, got {tensor.datatype}"
        )
    data = tensor.data
    if spec.scalar and data.ndim == 2 and data.shape[1] == 1:
        data = data[:, 0]
    if spec.row_shape is not None:
        row_shape = () if spec.scalar else spec.row_shape
        if data.ndim != 1 + len(row_shape) or any(
            want not in (-1, got) for want, got in zip(row_shape, data.shape[1:], strict=True)
        ):
            raise TensorError(
                f"input {spec.name!r} has shape {tensor.shape}; the model takes {spec.shape}"
            )
    if spec.text:
        try:
            return [value.decode() for value in data]
        except UnicodeDecodeError:
            raise TensorError(f"input {spec.name!r} is not UTF-8 text") from None
    if spec.datatype == "BYTES" or data.dtype == object:
        return list(data)
    if spec.array:
        return list(data)
    return data.tolist()  # type: ignore[no-any-return]


def field_values(result: Any) -> dict[str, Any]:
    """A record's (or a dict's) values by field name.

    Raises:
        ValueError: ``result`` is not a record.
    """
    if isinstance(result, dict):
        return result
    if isinstance(result, msgspec.Struct):
        return {name: getattr(result, name) for name in result.__struct_fields__}
    if dataclasses.is_dataclass(result):
        return {field.name: getattr(result, field.name) for field in dataclasses.fields(result)}
    if is_pydantic_model(type(result)):
        return {name: getattr(result, name) for name in type(result).model_fields}
    raise ValueError(f"a result is a {type(result).__name__}, not the declared record type")


def _stack(spec: TensorSpec, values: list[Any]) -> Tensor:
    """One output tensor from one value per row."""
    try:
        if spec.datatype == "BYTES" or (spec.datatype == ANY and _is_text(values[0])):
            texts = np.empty(len(values), dtype=object)
            texts[:] = [_encoded(value) for value in values]
            return Tensor(spec.name, "BYTES", texts.reshape(len(values), 1))
        dtype = None if spec.datatype == ANY else DATATYPES[spec.datatype]
        array: np.ndarray[Any, Any]
        if isinstance(values[0], np.ndarray):
            array = np.stack(values).astype(dtype, copy=False) if dtype else np.stack(values)
        else:
            array = np.asarray(values, dtype=dtype)
    except (ValueError, TypeError) as error:
        raise ValueError(f"output {spec.name!r}: the rows' results do not stack: {error}") from None
    if array.ndim == 1:
        array = array.reshape(len(values), 1)
    if dtype is not None:
        return Tensor(spec.name, spec.datatype, array)
    if array.dtype.kind in "USO":
        raise ValueError(f"output {spec.name!r}: the results are not numbers")
    return Tensor(spec.name, datatype_of(array), array)


def _encoded(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _is_text(value: Any) -> bool:
    return isinstance(value, (str, bytes))


# -- declared types to specs --------------------------------------------------------


def signature_of(declared: Any, default_name: str) -> Signature:
    """The signature of a declared item (``default_name="input"``) or result
    (``"output"``) type."""
    fields = record_fields(declared)
    if fields is not None:
        specs = tuple(_spec(name, hint, required) for name, hint, required in fields)
        return Signature(declared, specs, fields=True)
    if typing.get_origin(declared) is dict:
        _, value = typing.get_args(declared) or (str, Any)
        return Signature(declared, (), fields=True, open_spec=_spec("", value, True))
    if declared is dict:
        return Signature(declared, (), fields=True, open_spec=_spec("", Any, True))
    return Signature(declared, (_spec(default_name, declared, True),), fields=False)


def record_fields(declared: Any) -> list[tuple[str, Any, bool]] | None:
    """``(name, type, required)`` of each field of a record type, else None (a type
    without its ``Annotated`` constraints: they are checked when the item is built)."""
    fields = _annotated_fields(declared)
    if fields is None:
        return None
    return [(name, _unannotated(hint), required) for name, hint, required in fields]


def _unannotated(hint: Any) -> Any:
    """``X`` from ``Annotated[X, ...]``, else ``hint``."""
    return typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint


def _annotated_fields(declared: Any) -> list[tuple[str, Any, bool]] | None:
    if isinstance(declared, type) and issubclass(declared, msgspec.Struct):
        return [
            (field.encode_name, field.type, field.required)
            for field in msgspec.structs.fields(declared)
        ]
    if isinstance(declared, type) and dataclasses.is_dataclass(declared):
        try:
            hints = typing.get_type_hints(declared)
        except (NameError, TypeError):  # a hint that cannot be resolved: taken as Any
            hints = {}
        return [
            (
                field.name,
                hints.get(field.name, Any),
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING,
            )
            for field in dataclasses.fields(declared)
        ]
    if is_pydantic_model(declared):
        return [
            (name, info.annotation, info.is_required())
            for name, info in declared.model_fields.items()
        ]
    return None


def _spec(name: str, hint: Any, required: bool) -> TensorSpec:
    """The tensor of one field (or of the whole item) of declared type ``hint``."""
    hint = _unoptional(hint)
    dims: list[int] = []
    while _is_list(hint):
        dims.append(-1)
        (hint,) = typing.get_args(hint)[:1] or (Any,)
        hint = _unoptional(hint)
    scalar = not dims
    row_shape: tuple[int, ...] | None = tuple(dims) if dims else (1,)
    if hint is bool:
        datatype, accepts = "BOOL", frozenset({"BOOL"})
    elif hint is int:
        datatype, accepts = "INT64", _INTEGERS
    elif hint is float:
        datatype, accepts = "FP32", _FLOATS
    elif hint is str or hint is bytes:
        return TensorSpec(
            name, "BYTES", row_shape, frozenset({"BYTES"}), hint is str, scalar, required
        )
    elif _is_array_type(hint):
        dtype = declared_dtype(hint)
        if dtype is None:
            return TensorSpec(name, ANY, None, _NUMBERS, required=required, array=True)
        datatype = datatype_of(np.empty(0, dtype=dtype))
        accepts = frozenset({datatype})
        return TensorSpec(name, datatype, None, accepts, required=required, array=True)
    else:
        return TensorSpec(name, ANY, None, frozenset(), required=required)
    return TensorSpec(name, datatype, row_shape, accepts, False, scalar, required)


def _unoptional(hint: Any) -> Any:
    """``X`` from ``X | None`` and from ``Annotated[X, ...]`` (constraints such as
    ``msgspec.Meta`` are checked when the item is built, not here)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Annotated:
        return _unoptional(args[0])
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        if len(kept) == 1:
            return _unoptional(kept[0])
    return hint


def _is_list(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is None or not isinstance(origin, type) or origin in (str, bytes):
        return False
    if issubclass(origin, tuple):
        args = typing.get_args(hint)
        return len(args) == 2 and args[1] is Ellipsis
    return issubclass(origin, collections.abc.Sequence)


def _is_array_type(hint: Any) -> bool:
    return hint is np.ndarray or typing.get_origin(hint) is np.ndarray
