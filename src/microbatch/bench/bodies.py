"""Request bodies for a load run: from a file of examples, or from the service itself.

Without a file, ``bench`` reads the service's ``/openapi.json`` and takes the
request body's examples from it (the media type's ``example``/``examples``, or the
schema's ``examples``/``default``). When it declares none, one body is made up
from the JSON schema: every required property (every property when none is
required) with a plain value of its type — a string is an English sentence, a
number ``1.0``, an array one element. It fits simple item types; for anything
whose values matter (shapes, enums of meaning, lengths) pass ``--body-file``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from .client import Endpoint

__all__ = [
    "Bodies",
    "BodyError",
    "bodies_from_service",
    "examples_in",
    "parse_body",
    "read_body_file",
    "sample",
]

SENTENCE = "The quick brown fox jumps over the lazy dog."
"""The string a made-up body uses."""

_MAX_DEPTH = 16


class BodyError(Exception):
    """No usable request body: a bad file or line, or nothing to learn from the service."""


class Bodies(msgspec.Struct, frozen=True):
    """The encoded JSON bodies of a run and where they came from (for the report)."""

    items: list[bytes]
    source: str


def read_body_file(path: str | Path) -> Bodies:
    """One JSON value per non-blank line (JSON lines).

    Raises:
        BodyError: The file cannot be read, a line is not JSON, or no line has a body.
    """
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as error:
        raise BodyError(f"cannot read {path}: {error.strerror or error}") from error
    items = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            msgspec.json.decode(line)
        except msgspec.DecodeError as error:
            raise BodyError(f"{path}:{number}: not JSON ({error})") from error
        items.append(line)
    if not items:
        raise BodyError(f"{path}: no request bodies (one JSON value per line)")
    return Bodies(items, f"{len(items)} bodies from {path}")


def parse_body(text: str) -> Bodies:
    """One body given on the command line.

    Raises:
        BodyError: It is not JSON.
    """
    data = text.strip().encode()
    try:
        msgspec.json.decode(data)
    except msgspec.DecodeError as error:
        raise BodyError(f"--body is not JSON ({error})") from error
    return Bodies([data], "1 body from --body")


async def bodies_from_service(endpoint: Endpoint, timeout_s: float = 10.0) -> Bodies:
    """Bodies from the service's OpenAPI document (see the module's docstring).

    Raises:
        BodyError: ``/openapi.json`` is missing or has no JSON request body for the
            endpoint's path.
        OSError: The service cannot be reached.
    """
    response = await endpoint.fetch("/openapi.json", timeout_s)
    if response.status != 200:
        raise BodyError(
            f"GET /openapi.json answered {response.status}: pass request bodies with --body-file"
        )
    try:
        document = msgspec.json.decode(response.body)
    except msgspec.DecodeError as error:
        raise BodyError(f"/openapi.json is not JSON ({error})") from error
    path = endpoint.path.split("?", 1)[0]
    found = examples_in(document, path)
    if found:
        items = [msgspec.json.encode(value) for value in found]
        return Bodies(items, f"{len(items)} example(s) from /openapi.json")
    schema = _request_schema(document, path)
    if schema is None:
        raise BodyError(f"/openapi.json has no JSON request body for POST {path}: pass --body-file")
    body = msgspec.json.encode(sample(schema, document))
    return Bodies([body], f"1 body made up from the OpenAPI schema: {body.decode()[:80]}")


def examples_in(document: Mapping[str, Any], path: str) -> list[Any]:
    """The request examples an OpenAPI document gives for ``POST path`` (maybe none)."""
    media = _media_type(document, path)
    if media is None:
        return []
    if "example" in media:
        return [media["example"]]
    examples = media.get("examples")
    if isinstance(examples, Mapping):  # OpenAPI: name -> {"value": ...}
        return [e["value"] for e in examples.values() if isinstance(e, Mapping) and "value" in e]
    schema = _resolve(media.get("schema", {}), document)
    listed = schema.get("examples") if isinstance(schema, Mapping) else None
    if isinstance(listed, list) and listed:  # JSON Schema: a list of values
        return list(listed)
    return []


def sample(schema: Any, document: Mapping[str, Any], depth: int = 0) -> Any:
    """A plain value that fits a JSON schema (``$ref`` resolved in ``document``)."""
    schema = _resolve(schema, document)
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return None
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    if schema.get("enum"):
        return schema["enum"][0]
    if isinstance(schema.get("examples"), list) and schema["examples"]:
        return schema["examples"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = [o for o in schema.get(key, ()) if _resolve(o, document) != {"type": "null"}]
        if options:
            return sample(options[0], document, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        properties: Mapping[str, Any] = schema.get("properties", {})
        names = schema.get("required") or list(properties)
        return {name: sample(properties.get(name, {}), document, depth + 1) for name in names}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1)))
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list) and prefix:
            return [sample(item, document, depth + 1) for item in prefix]
        return [sample(schema.get("items", {}), document, depth + 1) for _ in range(count)]
    if kind == "string":
        length = int(schema.get("minLength", 0))
        return SENTENCE if length <= len(SENTENCE) else (SENTENCE * length)[:length]
    if kind in ("number", "integer"):
        value = 1
        if "minimum" in schema:
            value = max(value, schema["minimum"])
        if "exclusiveMinimum" in schema:
            value = max(value, schema["exclusiveMinimum"] + 1)
        if "maximum" in schema:
            value = min(value, schema["maximum"])
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return 1.0  # no type declared: any JSON


def _media_type(document: Mapping[str, Any], path: str) -> Mapping[str, Any] | None:
    try:
        media = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    except (KeyError, TypeError):
        return None
    return media if isinstance(media, Mapping) else None


def _request_schema(document: Mapping[str, Any], path: str) -> Any:
    media = _media_type(document, path)
    return None if media is None else media.get("schema", {})


def _resolve(schema: Any, document: Mapping[str, Any]) -> Any:
    """Follow ``$ref`` (``#/...`` pointers only) until a schema without one."""
    seen = 0
    while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
        pointer = schema["$ref"]
        if not pointer.startswith("#/") or seen > _MAX_DEPTH:
            return {}
        target: Any = document
        for part in pointer[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, Mapping) else None
        schema, seen = target, seen + 1
    return schema
