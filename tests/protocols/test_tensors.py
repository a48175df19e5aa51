"""Tensors of the v2 protocol: every datatype both ways (JSON and raw bytes), and bad
input is always a TensorError (400) naming the reason, never anything else."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from microbatch.signature import signature_of
from microbatch.tensors import (
    DATATYPES,
    MAX_ROWS,
    Tensor,
    TensorError,
    datatype_of,
    from_json,
    from_raw,
    to_json_data,
    to_raw,
)

NUMERIC = [name for name in DATATYPES if name != "BYTES"]


@st.composite
def tensors(draw: st.DrawFn) -> Tensor:
    datatype = draw(st.sampled_from(list(DATATYPES)))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4))
    if datatype == "BYTES":
        values = draw(
            st.lists(
                st.binary(max_size=8), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))
            )
        )
        data = np.empty(len(values), dtype=object)
        data[:] = values
        return Tensor("t", datatype, data.reshape(shape))
    dtype = DATATYPES[datatype]
    elements = hnp.from_dtype(dtype, allow_nan=False, allow_infinity=False)
    return Tensor("t", datatype, draw(hnp.arrays(dtype, shape, elements=elements)))


@settings(max_examples=150, deadline=None)
@given(tensors())
def test_raw_bytes_round_trip(tensor: Tensor) -> None:
    back = from_raw("t", tensor.datatype, tensor.shape, to_raw(tensor))
    assert back.shape == tensor.shape
    assert back.data.tolist() == tensor.data.tolist()


@settings(max_examples=150, deadline=None)
@given(tensors())
def test_json_data_round_trip(tensor: Tensor) -> None:
    wire = msgspec.json.decode(msgspec.json.encode(to_json_data(tensor)))
    if tensor.datatype == "BYTES":
        wire = [bytes(v) if isinstance(v, list) else v.encode() for v in wire]
    back = from_json("t", tensor.datatype, tensor.shape, wire)
    assert back.data.tolist() == tensor.data.tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([*DATATYPES, "FP8", ""]),
    st.lists(st.integers(-2, 5), max_size=3),
    st.binary(max_size=40),
)
def test_any_raw_input_is_a_tensor_or_a_tensor_error(
    datatype: str, shape: list[int], raw: bytes
) -> None:
    try:
        tensor = from_raw("t", datatype, shape, raw)
    except TensorError:
        return
    assert tensor.shape == shape


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(list(DATATYPES)),
    st.lists(st.integers(0, 3), min_size=1, max_size=2),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3),
        lambda inner: st.lists(inner, max_size=3),
        max_leaves=8,
    ),
)
def test_any_json_input_is_a_tensor_or_a_tensor_error(
    datatype: str, shape: list[int], data: Any
) -> None:
    try:
        tensor = from_json("t", datatype, shape, data)
    except TensorError:
        return
    assert tensor.shape == shape


@pytest.mark.parametrize(
    ("datatype", "shape", "data", "reason"),
    [
        ("FP32", [2], [1.0], "needs 2 elements"),
        ("UINT8", [1], [300], "not UINT8"),
        ("INT8", [1], [1.5], "expected integers"),
        ("FP16", [1], [70000.0], "out of range"),
        ("FP32", [1], [1e300], "out of range"),
        ("FP32", [2, 1], [[1e300], [1.0]], "overflow"),
        ("FP64", [1], ["1"], "expected numbers"),
        ("FP32", [1], ["a"], "not FP32"),
        ("BOOL", [1], [1], "true or false"),
        ("BYTES", [1], [1], "must be strings"),
        ("FP8", [1], [1], "unknown datatype"),
        ("FP32", [], [], "shape is empty"),
        ("FP32", [-1], [], "below 0"),
        ("FP32", [MAX_ROWS + 1, 0], [], "the limit"),
    ],
)
def test_json_errors_say_why(datatype: str, shape: list[int], data: Any, reason: str) -> None:
    with pytest.raises(TensorError, match=reason):
        from_json("t", datatype, shape, data)


def test_raw_bytes_errors_say_why() -> None:
    with pytest.raises(TensorError, match="needs 8 bytes"):
        from_raw("t", "FP32", [2], b"\0" * 7)
    with pytest.raises(TensorError, match="cut short"):
        from_raw("t", "BYTES", [1], b"\x05\0\0\0abc")
    with pytest.raises(TensorError, match="after the last"):
        from_raw("t", "BYTES", [1], b"\x01\0\0\0ab")
    with pytest.raises(TensorError, match="0 or 1"):
        from_raw("t", "BOOL", [1], b"\x02")


def test_datatypes_of_numpy_arrays() -> None:
    for name in NUMERIC:
        assert datatype_of(np.zeros(1, dtype=DATATYPES[name])) == name
    assert datatype_of(np.asarray(["a"])) == "BYTES"
    with pytest.raises(TensorError):
        datatype_of(np.zeros(1, dtype=np.complex64))


class Record(msgspec.Struct):
    text: str
    weights: list[float]
    count: int = 1
    mask: npt.NDArray[np.uint8] | None = None


def test_a_record_is_one_tensor_per_field() -> None:
    signature = signature_of(Record, "input")
    shown = [(spec.name, spec.datatype, spec.shape, spec.required) for spec in signature.specs]
    assert shown == [
        ("text", "BYTES", [-1, 1], True),
        ("weights", "FP32", [-1, -1], True),
        ("count", "INT64", [-1, 1], False),
        ("mask", "UINT8", [-1, -1], False),
    ]
    texts = np.empty((2, 1), dtype=object)
    texts[:] = [[b"a"], [b"b"]]
    items = signature.items(
        [
            Tensor("text", "BYTES", texts),
            Tensor("weights", "FP64", np.asarray([[1.0, 2.0], [3.0, 4.0]])),
        ]
    )
    assert items == [Record("a", [1.0, 2.0]), Record("b", [3.0, 4.0])]
    with pytest.raises(TensorError, match="missing input 'text'"):
        signature.items([Tensor("weights", "FP32", np.zeros((1, 2), np.float32))])
    with pytest.raises(TensorError, match="different numbers of rows"):
        signature.items(
            [Tensor("text", "BYTES", texts), Tensor("weights", "FP32", np.zeros((3, 2)))]
        )


class Constrained(msgspec.Struct):
    text: Annotated[str, msgspec.Meta(max_length=3)]
    count: Annotated[int, msgspec.Meta(ge=1)] | None = None


def test_annotated_fields_are_their_types_and_keep_their_constraints() -> None:
    signature = signature_of(Constrained, "input")
    shown = [(spec.name, spec.datatype, spec.shape) for spec in signature.specs]
    assert shown == [("text", "BYTES", [-1, 1]), ("count", "INT64", [-1, 1])]
    texts = np.empty((2, 1), dtype=object)
    texts[:] = [[b"abc"], [b"abcd"]]
    assert signature.items([Tensor("text", "BYTES", texts[:1])]) == [Constrained("abc")]
    with pytest.raises(TensorError, match="length <= 3"):
        signature.items([Tensor("text", "BYTES", texts)])


def test_results_stack_into_output_tensors_and_ragged_ones_do_not() -> None:
    signature = signature_of(list[float], "output")
    (tensor,) = signature.tensors([[1.0, 2.0], [3.0, 4.0]])
    assert (tensor.name, tensor.datatype, tensor.shape) == ("output", "FP32", [2, 2])
    with pytest.raises(ValueError, match="do not stack"):
        signature.tensors([[1.0], [2.0, 3.0]])


def test_a_dict_takes_any_names() -> None:
    signature = signature_of(dict[str, float], "input")
    items = signature.items([Tensor("a", "FP32", np.asarray([[1.0], [2.0]], np.float32))])
    assert items == [{"a": 1.0}, {"a": 2.0}]
    (tensor,) = signature_of(dict[str, float], "output").tensors([{"b": 1.0}])
    assert (tensor.name, tensor.datatype) == ("b", "FP32")


def test_a_chunk_is_one_row_of_output_tensors() -> None:
    from microbatch.inference import OutputMismatch, chunk_tensors

    (text,) = chunk_tensors("a")
    assert (text.name, text.datatype, text.shape) == ("output", "BYTES", [1, 1])
    (numbers,) = chunk_tensors([1.0, 2.5])
    assert (numbers.name, numbers.datatype, numbers.shape) == ("output", "FP64", [1, 2])
    token, logprob = chunk_tensors({"token": "x", "logprob": -0.5})
    assert (token.name, token.datatype, logprob.name, logprob.datatype) == (
        "token",
        "BYTES",
        "logprob",
        "FP64",
    )
    assert [tensor.name for tensor in chunk_tensors(Record("t", [1.0]))] == [
        "text",
        "weights",
        "count",
    ]
    with pytest.raises(OutputMismatch, match="a chunk"):
        chunk_tensors(object())


class _Declared:
    """Just what :class:`~microbatch.inference.InferenceModel` reads of a servable."""

    def __init__(self, input_type: Any) -> None:
        self.name = "declared"
        self.input_type = input_type
        self.output_type = Any


def test_a_generate_request_is_one_row_of_plain_values() -> None:
    from microbatch.inference import InferenceModel

    record = InferenceModel(_Declared(Record))  # type: ignore[arg-type]
    assert record.row_item({"text": "hi", "weights": [1, 2.5]}) == Record("hi", [1.0, 2.5])
    with pytest.raises(TensorError, match="input 'weights' has shape"):
        record.row_item({"text": "hi", "weights": [[1.0]]})
    with pytest.raises(TensorError, match="input 'text': BYTES data must be strings"):
        record.row_item({"text": 3, "weights": []})
    # an undeclared input takes the value's own datatype, read as /infer reads it
    undeclared = InferenceModel(_Declared(dict[str, Any]))  # type: ignore[arg-type]
    item = undeclared.row_item({"a": "x", "b": True, "c": 3, "d": [0.5, 1.5]})
    assert item == {"a": b"x", "b": True, "c": 3, "d": [0.5, 1.5]}
    with pytest.raises(TensorError, match="the data is not FP64"):  # ragged
        undeclared.row_item({"d": [[1.0, 2.0], [3.0]]})


def test_a_result_as_plain_values_by_output_name() -> None:
    from microbatch.inference import output_values

    assert output_values("a") == {"output": "a"}
    assert output_values(Record("t", [1.0])) == {"text": "t", "weights": [1.0], "count": 1}
    assert output_values({"token": "x", "logprob": None}) == {"token": "x"}
