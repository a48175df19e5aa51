"""Tensors of the Open Inference Protocol v2: datatypes, shapes, JSON and binary data.

A :class:`Tensor` is a name, a v2 datatype and a numpy array of that shape. It is
read from a request's JSON ``data`` (flat or nested lists) or from raw bytes (the
binary tensor data extension of REST, ``raw_input_contents`` of gRPC), and written
back the same two ways. ``BYTES`` elements are ``bytes``; on the wire, raw ``BYTES``
data is each element's length (4 bytes, little endian) followed by the element.

Everything a client can get wrong raises :class:`TensorError` (400) naming the
tensor and what does not match; nothing here raises anything else for bad input.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import MicrobatchError

__all__ = [
    "DATATYPES",
    "MAX_ROWS",
    "Tensor",
    "TensorError",
    "datatype_of",
    "from_json",
    "from_raw",
    "to_json_data",
    "to_raw",
]

DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
"""Each v2 datatype and the numpy dtype of its elements (little endian on the wire)."""

_BY_DTYPE = {dtype: name for name, dtype in DATATYPES.items() if name != "BYTES"}
_FLOAT_LIMITS = {"FP16": float(np.finfo(np.float16).max), "FP32": float(np.finfo(np.float32).max)}
_PLAIN_NUMBERS = (int, float)  # by type(): bool and str are not among them
_SMALL = 64
_INTEGERS = frozenset(name for name in DATATYPES if "INT" in name)

MAX_ROWS = 4096
"""Most rows (items) one request may carry: each row is one item in the batcher."""

_LENGTH = struct.Struct("<I")


class TensorError(MicrobatchError):
    """A tensor's name, datatype, shape or data does not match: 400 with the reason."""

    http_status = 400


@dataclass(frozen=True, slots=True)
class Tensor:
    """One named tensor.

    Attributes:
        name: The input's or output's name.
        datatype: A key of :data:`DATATYPES`.
        data: The elements, shaped (``object`` dtype of ``bytes`` for ``BYTES``).
    """

    name: str
    datatype: str
    data: np.ndarray[Any, Any]

    @property
    def shape(self) -> list[int]:
        """The tensor's shape, as the protocol writes it."""
        return list(self.data.shape)


def _dtype(name: str, datatype: str) -> np.dtype[Any]:
    dtype = DATATYPES.get(datatype)
    if dtype is None:
        known = ", ".join(DATATYPES)
        raise TensorError(f"input {name!r}: unknown datatype {datatype!r}; use one of {known}")
    return dtype


def _elements(name: str, shape: Sequence[int]) -> int:
    if not shape:
        raise TensorError(f"input {name!r}: the shape is empty; the first dimension is the rows")
    for n in shape:
        if type(n) is not int or n < 0:
            raise TensorError(f"input {name!r}: shape {list(shape)} has a dimension below 0")
    if shape[0] > MAX_ROWS:
        raise TensorError(f"input {name!r}: {shape[0]} rows; the limit is {MAX_ROWS}")
    return math.prod(shape)


def from_json(name: str, datatype: str, shape: Sequence[int], data: Any) -> Tensor:
    """A tensor from a JSON ``data`` field: flat or nested lists in row-major order.

    Raises:
        TensorError: Unknown datatype, bad shape, wrong number of elements, or
            elements the datatype cannot hold (a string in ``FP32``, 300 in ``UINT8``).
    """
    dtype = _dtype(name, datatype)
    count = _elements(name, shape)
    if not isinstance(data, list):
        data = [data]
    try:
        if datatype == "BYTES":
            flat = np.asarray(data, dtype=object).reshape(-1)
            array = np.fromiter((_as_bytes(name, value) for value in flat), object, len(flat))
        elif datatype == "BOOL":
            array = np.asarray(data)
            if array.dtype != np.bool_ and array.size:
                raise TensorError(f"input {name!r}: BOOL data must be true or false")
            array = array.astype(np.bool_)
        elif datatype in _INTEGERS and not _integral(data):
            raise ValueError("expected integers")
        elif len(data) <= _SMALL and all(type(value) in _PLAIN_NUMBERS for value in data):
            # a few plain numbers (most requests): checked here, cheaper than numpy's
            # checks below; a float too large for FP16/FP32 is refused, not made inf
            limit = _FLOAT_LIMITS.get(datatype)
            if limit is not None and data and max(map(abs, data)) > limit:
                raise ValueError(f"a number is out of range for {datatype}")
            array = np.asarray(data, dtype=dtype)
        elif np.asarray(data).dtype.kind not in "biuf":  # strings, nulls, ragged lists
            raise ValueError("expected numbers in a rectangular list")
        elif datatype in _FLOAT_LIMITS:
            # errstate is per context (numpy 2): a float cast that overflows raises here
            with np.errstate(over="raise"):
                array = np.asarray(data, dtype=dtype)
        else:
            array = np.asarray(data, dtype=dtype)
    except TensorError:
        raise
    except (ValueError, TypeError, OverflowError, FloatingPointError) as error:
        raise TensorError(f"input {name!r}: the data is not {datatype}: {_short(error)}") from None
    if array.size != count:
        raise TensorError(
            f"input {name!r}: shape {list(shape)} needs {count} elements, the data has {array.size}"
        )
    return Tensor(name, datatype, array.reshape(shape))


def _integral(data: list[Any]) -> bool:
    """Whether ``data`` (nested lists) holds no float: an integer tensor takes none."""
    if len(data) <= _SMALL and all(type(value) is int for value in data):
        return True
    return np.asarray(data).dtype.kind in "biu"


def _as_bytes(name: str, value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    raise TensorError(f"input {name!r}: BYTES data must be strings, got {type(value).__name__}")


def from_raw(name: str, datatype: str, shape: Sequence[int], raw: bytes | memoryview) -> Tensor:
    """A tensor from raw little-endian bytes (the binary data extension, gRPC's raw
    contents).

    Raises:
        TensorError: Unknown datatype, bad shape, or a byte count the shape does not
            need.
    """
    dtype = _dtype(name, datatype)
    count = _elements(name, shape)
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        view = memoryview(raw)
        offset = 0
        for index in range(count):
            if offset + 4 > len(view):
                raise TensorError(f"input {name!r}: the BYTES data ends before element {index}")
            (length,) = _LENGTH.unpack_from(view, offset)
            offset += 4
            if offset + length > len(view):
                raise TensorError(f"input {name!r}: BYTES element {index} is cut short")
            array[index] = bytes(view[offset : offset + length])
            offset += length
        if offset != len(view):
            raise TensorError(f"input {name!r}: {len(view) - offset} bytes after the last element")
        return Tensor(name, datatype, array.reshape(shape))
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise TensorError(
            f"input {name!r}: shape {list(shape)} of {datatype} needs {expected} bytes, "
            f"got {len(raw)}"
        )
    array = np.frombuffer(raw, dtype=dtype)
    if datatype == "BOOL" and array.size and array.view(np.uint8).max() > 1:
        raise TensorError(f"input {name!r}: BOOL bytes must be 0 or 1")
    return Tensor(name, datatype, array.reshape(shape))


def to_raw(tensor: Tensor) -> bytes:
    """The tensor's elements as raw little-endian bytes (length-prefixed for BYTES)."""
    if tensor.datatype == "BYTES":
        parts = []
        for value in tensor.data.reshape(-1):
            parts.append(_LENGTH.pack(len(value)))
            parts.append(value)
        return b"".join(parts)
    return np.ascontiguousarray(tensor.data, dtype=DATATYPES[tensor.datatype]).tobytes()


def to_json_data(tensor: Tensor) -> list[Any]:
    """The tensor's elements as one flat list (``BYTES`` as text, or as a list of
    byte values where an element is not UTF-8)."""
    flat = tensor.data.reshape(-1)
    if tensor.datatype == "BYTES":
        return [_as_text(value) for value in flat]
    return flat.tolist()  # type: ignore[no-any-return]


def _as_text(value: bytes) -> Any:
    try:
        return value.decode()
    except UnicodeDecodeError:
        return list(value)


def datatype_of(array: np.ndarray[Any, Any]) -> str:
    """The v2 datatype of a numpy array (``BYTES`` for strings and objects).

    Raises:
        TensorError: A dtype no v2 datatype carries (complex numbers, dates).
    """
    name = _BY_DTYPE.get(array.dtype)
    if name is not None:
        return name
    if array.dtype.kind in "USO":
        return "BYTES"
    if array.dtype.byteorder == ">":
        return datatype_of(array.astype(array.dtype.newbyteorder("<")))
    raise TensorError(f"no v2 datatype carries numpy dtype {array.dtype}")


def _short(error: BaseException, limit: int = 120) -> str:
    text = str(error)
    return text if len(text) <= limit else text[: limit - 3] + "..."
