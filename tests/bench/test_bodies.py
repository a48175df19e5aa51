"""Request bodies: from a JSON-lines file, from OpenAPI examples, or made up from a schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from microbatch.bench import BodyError, parse_body, read_body_file, sample
from microbatch.bench.bodies import SENTENCE, examples_in
from microbatch.http.schema import openapi_document


def test_a_body_file_gives_one_body_per_non_blank_line(tmp_path: Path) -> None:
    path = tmp_path / "bodies.jsonl"
    path.write_text('{"x": 1}\n\n  {"x": 2}  \n[3]\n')
    bodies = read_body_file(path)
    assert bodies.items == [b'{"x": 1}', b'{"x": 2}', b"[3]"]
    assert "3 bodies" in bodies.source


def test_a_bad_line_is_named_by_its_number(tmp_path: Path) -> None:
    path = tmp_path / "bodies.jsonl"
    path.write_text('{"x": 1}\n{"x": \n')
    with pytest.raises(BodyError, match=r"bodies.jsonl:2: not JSON"):
        read_body_file(path)


def test_an_empty_or_missing_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(BodyError, match="no request bodies"):
        read_body_file(tmp_path / "empty.jsonl")
    with pytest.raises(BodyError, match="cannot read"):
        read_body_file(tmp_path / "missing.jsonl")


def test_an_inline_body_must_be_json() -> None:
    assert parse_body(' {"text": "hi"} ').items == [b'{"text": "hi"}']
    with pytest.raises(BodyError):
        parse_body("{text}")


class Request(msgspec.Struct):
    text: str
    count: int = 3
    weights: list[float] = []
    mode: str | None = None


def test_a_body_made_up_from_microbatchs_own_schema_decodes_as_the_item_type() -> None:
    document = openapi_document("t", "0", Request, Request, auth=False)
    schema = document["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]
    body = sample(schema["schema"], document)
    assert body == {"text": SENTENCE}
    assert msgspec.json.decode(msgspec.json.encode(body), type=Request).text == SENTENCE


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "integer", "minimum": 5}, 5),
        ({"type": "number", "exclusiveMinimum": 2}, 3.0),
        ({"type": "number", "maximum": 0.5}, 0.5),
        ({"type": "string", "minLength": 60}, (SENTENCE * 2)[:60]),
        ({"enum": ["b", "a"]}, "b"),
        ({"const": 7}, 7),
        ({"type": "boolean", "default": False}, False),
        ({"anyOf": [{"type": "null"}, {"type": "integer"}]}, 1),
        ({"type": ["null", "string"]}, SENTENCE),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, [1, 1]),
        (
            {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}]},
            [SENTENCE, True],
        ),
        ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}}, {"a": 1, "b": 1.0}),
        ({"$ref": "#/components/schemas/P"}, {"x": 1.0}),
        ({}, 1.0),
    ],
)
def test_sample_values_fit_their_schemas(schema: dict[str, Any], expected: Any) -> None:
    document = {
        "components": {
            "schemas": {
                "P": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
            }
        }
    }
    assert sample(schema, document) == expected


def test_a_schema_that_refers_to_itself_ends() -> None:
    """A ``$ref`` loop, and a type that holds itself, give a finite value: the loop
    (no type to be found) any JSON value, the tree a bounded nesting."""
    loop = {"components": {"schemas": {"Node": {"$ref": "#/components/schemas/Node"}}}}
    assert sample({"$ref": "#/components/schemas/Node"}, loop) == 1.0
    tree = {
        "type": "object",
        "properties": {"child": {"$ref": "#/components/schemas/Tree"}},
        "required": ["child"],
    }
    document = {"components": {"schemas": {"Tree": tree}}}
    body = sample({"$ref": "#/components/schemas/Tree"}, document)
    depth = 0
    while isinstance(body, dict):
        assert list(body) == ["child"]
        body, depth = body["child"], depth + 1
    assert body is None
    assert 1 < depth <= 20


def _document(media: dict[str, Any]) -> dict[str, Any]:
    return {
        "paths": {"/predict": {"post": {"requestBody": {"content": {"application/json": media}}}}}
    }


@pytest.mark.parametrize(
    ("media", "expected"),
    [
        ({"example": {"x": 1}}, [{"x": 1}]),
        ({"examples": {"a": {"value": {"x": 1}}, "b": {"value": {"x": 2}}}}, [{"x": 1}, {"x": 2}]),
        ({"schema": {"type": "object", "examples": [{"x": 3}]}}, [{"x": 3}]),
        ({"schema": {"type": "object"}}, []),
    ],
)
def test_openapi_examples_are_found_where_openapi_and_json_schema_put_them(
    media: dict[str, Any], expected: list[Any]
) -> None:
    assert examples_in(_document(media), "/predict") == expected
    assert examples_in(_document(media), "/other") == []


def test_the_declared_examples_are_published_and_found_before_any_made_up_body() -> None:
    document = openapi_document(
        "t", "0", Request, Request, auth=False, examples=[Request("hi"), Request("yo", 1)]
    )
    assert examples_in(document, "/predict") == [
        {"text": "hi", "count": 3, "weights": [], "mode": None},
        {"text": "yo", "count": 1, "weights": [], "mode": None},
    ]
    for value in examples_in(document, "/predict"):
        msgspec.json.decode(msgspec.json.encode(value), type=Request)
    assert examples_in(openapi_document("t", "0", Request, Request, auth=False), "/predict") == []
