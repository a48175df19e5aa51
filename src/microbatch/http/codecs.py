"""JSON and msgpack, both ways, with numpy arrays as nested lists.

The decoder is chosen from the request's ``Content-Type`` among these two only:
nothing from the network is ever unpickled. The encoder is chosen from ``Accept``.
numpy is optional: arrays and numpy scalars are handled only when numpy is imported.
So is pydantic: an item type that is a pydantic model is validated by pydantic (its
errors become msgspec's, so they map to the same status codes), and pydantic
results are encoded through ``model_dump``.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from .._hints import declared_dtype, is_pydantic_model

__all__ = [
    "CODECS",
    "JSON",
    "MSGPACK",
    "Codec",
    "Decoder",
    "NotAcceptable",
    "UnsupportedMediaType",
    "codec_for_accept",
    "codec_for_content_type",
    "decode_hook",
    "encode_hook",
    "is_pydantic_model",
]

Decoder = Callable[[bytes], Any]


class UnsupportedMediaType(Exception):
    """The request body is in a format other than JSON or msgpack."""


class NotAcceptable(Exception):
    """The client accepts neither JSON nor msgpack."""


@dataclass(frozen=True)
class Codec:
    """One wire format: its media type and how to build its encoder and decoders."""

    name: str
    media_type: bytes
    encode: Callable[[Any], bytes]
    make_decoder: Callable[[Any], Decoder]


def encode_hook(value: Any) -> Any:
    """Encode what msgspec does not know: numpy arrays as nested lists, numpy scalars
    as Python numbers.

    Raises:
        NotImplementedError: Any other type.
    """
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(value, numpy.ndarray):
            return value.tolist()
        if isinstance(value, numpy.generic):
            return value.item()
    if is_pydantic_model(type(value)):
        return value.model_dump(mode="json")
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def _pydantic_decoder(model: Any, parse: Callable[[bytes], Any] | None) -> Decoder:
    """Validate with pydantic: straight from JSON bytes, or from what ``parse`` made of
    the body. A validation error becomes ``msgspec.ValidationError`` naming the
    location; malformed JSON becomes ``msgspec.DecodeError``."""
    from pydantic import ValidationError

    def decode(body: bytes) -> Any:
        try:
            return (
                model.model_validate_json(body)
                if parse is None
                else model.model_validate(parse(body))
            )
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            if first["type"] == "json_invalid":
                raise msgspec.DecodeError(f"malformed JSON: {first['msg']}") from None
            where = ".".join(str(part) for part in first["loc"]) or "the body"
            raise msgspec.ValidationError(f"{first['msg']} - at `{where}`") from None

    return decode


def _json_decoder(item_type: Any) -> Decoder:
    if is_pydantic_model(item_type):
        return _pydantic_decoder(item_type, None)
    return msgspec.json.Decoder(item_type, dec_hook=decode_hook).decode


def _msgpack_decoder(item_type: Any) -> Decoder:
    if is_pydantic_model(item_type):
        return _pydantic_decoder(item_type, msgspec.msgpack.Decoder().decode)
    return msgspec.msgpack.Decoder(item_type, dec_hook=decode_hook).decode


def decode_hook(expected: Any, value: Any) -> Any:
    """Decode a declared numpy array type (``np.ndarray``, ``npt.NDArray[np.float32]``)
    from nested lists.

    Raises:
        ValueError: The lists are ragged, hold something that is not a number, or a
            number the declared dtype cannot hold (300 for ``uint8``, 1e300 for
            ``float32``); msgspec reports it as a validation error at its path.
        NotImplementedError: ``expected`` is not a numpy array type.
    """
    numpy = sys.modules.get("numpy")
    if numpy is None or (
        expected is not numpy.ndarray and typing.get_origin(expected) is not numpy.ndarray
    ):
        raise NotImplementedError(f"cannot decode {expected!r}")
    dtype = declared_dtype(expected)
    try:
        # errstate is per context (numpy 2): a float cast that overflows raises here only
        with numpy.errstate(over="raise"):
            array = numpy.asarray(value, dtype=dtype)
    except (OverflowError, FloatingPointError) as error:
        kind = "the declared dtype" if dtype is None else numpy.dtype(dtype).name
        raise ValueError(f"a number is out of range for {kind}: {_short(error)}") from None
    except (TypeError, ValueError) as error:
        raise ValueError(f"expected a numeric array: {error}") from None
    if array.dtype.kind not in "biufc":
        raise ValueError("expected a numeric array (nested lists of numbers)")
    return array


def _short(error: BaseException, limit: int = 120) -> str:
    """An error's message cut to ``limit`` characters (it may quote a 400-digit number)."""
    text = str(error)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_json_encoder = msgspec.json.Encoder(enc_hook=encode_hook)
_msgpack_encoder = msgspec.msgpack.Encoder(enc_hook=encode_hook)


def _guarded(decode: Decoder) -> Decoder:
    """``decode``, with the malformed bodies msgspec reports as other errors reported
    as malformed (400) rather than server errors: nested too deeply (RecursionError,
    from a few hundred levels on) or a string that is not UTF-8 (UnicodeDecodeError)."""

    def decode_guarded(body: bytes) -> Any:
        try:
            return decode(body)
        except RecursionError:
            raise msgspec.DecodeError("the body is nested too deeply") from None
        except UnicodeDecodeError as error:
            raise msgspec.DecodeError(f"the body has a string that is not UTF-8: {error}") from None

    return decode_guarded


JSON = Codec(
    name="json",
    media_type=b"application/json",
    encode=_json_encoder.encode,
    make_decoder=lambda item_type: _guarded(_json_decoder(item_type)),
)
MSGPACK = Codec(
    name="msgpack",
    media_type=b"application/msgpack",
    encode=_msgpack_encoder.encode,
    make_decoder=lambda item_type: _guarded(_msgpack_decoder(item_type)),
)
CODECS = (JSON, MSGPACK)

_BY_MEDIA_TYPE = {
    b"application/json": JSON,
    b"application/msgpack": MSGPACK,
    b"application/x-msgpack": MSGPACK,
    b"application/vnd.msgpack": MSGPACK,
}
_ANY_JSON = {b"*/*", b"application/*"}


def codec_for_content_type(content_type: bytes | None) -> Codec:
    """The codec of a request body; JSON when no ``Content-Type`` is given.

    Raises:
        UnsupportedMediaType: Any other media type.
    """
    if content_type is None:
        return JSON
    media_type = content_type.split(b";", 1)[0].strip().lower()
    codec = _BY_MEDIA_TYPE.get(media_type)
    if codec is None:
        raise UnsupportedMediaType(
            f"Content-Type {media_type.decode('latin-1')!r} is not supported; "
            "send application/json or application/msgpack"
        )
    return codec


def codec_for_accept(accept: bytes | None) -> Codec:
    """The codec of the response: the first of JSON or msgpack that ``Accept`` names
    (``*/*`` means JSON); JSON when no ``Accept`` is given. Quality values are ignored.

    Raises:
        NotAcceptable: ``Accept`` names neither.
    """
    if accept is None:
        return JSON
    for media_range in accept.split(b","):
        media_type = media_range.split(b";", 1)[0].strip().lower()
        codec = _BY_MEDIA_TYPE.get(media_type)
        if codec is not None:
            return codec
        if media_type in _ANY_JSON:
            return JSON
    raise NotAcceptable(
        f"Accept {accept.decode('latin-1')!r} names neither application/json "
        "nor application/msgpack"
    )
