"""A small self-contained HTML page that shows an OpenAPI document (no scripts, no
external assets): every route with its request schema and its responses."""

from __future__ import annotations

import html
from typing import Any

import msgspec

__all__ = ["docs_page"]


def docs_page(document: dict[str, Any]) -> bytes:
    """A small HTML page listing every route with its request and response schemas."""
    title = html.escape(str(document["info"]["title"]))
    sections = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            rows = "".join(
                f"<li><b>{html.escape(code)}</b> {html.escape(str(response['description']))}</li>"
                for code, response in operation["responses"].items()
            )
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            request = _pre(body["schema"]) if body else ""
            sections.append(
                f"<section><h2><code>{method.upper()} {html.escape(path)}</code></h2>"
                f"<p>{html.escape(operation.get('summary', ''))}</p>{request}<ul>{rows}</ul>"
                "</section>"
            )
    schemas = _pre(document["components"]["schemas"])
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>body{{font-family:sans-serif;max-width:60em;margin:auto}}"
        "pre{background:#f4f4f4;padding:1em;overflow:auto}</style></head><body>"
        f"<h1>{title}</h1><p>Bodies are JSON or msgpack (<code>Content-Type</code>, "
        "<code>Accept</code>). The full document is at <a href='openapi.json'>openapi.json</a>."
        f"</p>{''.join(sections)}<h2>Schemas</h2>{schemas}</body></html>"
    ).encode()


def _pre(value: Any) -> str:
    text = msgspec.json.format(msgspec.json.encode(value)).decode()
    return f"<pre>{html.escape(text)}</pre>"
