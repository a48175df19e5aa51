"""The same probe as ``probe_httptools.py`` as a granian RSGI app (issue 15).

Run: ``granian --interface rsgi --host 127.0.0.1 --port PORT --workers 1
--loop uvloop probe_granian:app`` from this directory.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Body(msgspec.Struct):
    x: float


class Reply(msgspec.Struct):
    y: float


decode = msgspec.json.Decoder(Body).decode
encode = msgspec.json.Encoder().encode
HEADERS = [("content-type", "application/json")]


async def app(scope: Any, protocol: Any) -> None:
    body = await protocol()
    protocol.response_bytes(200, HEADERS, encode(Reply(2 * decode(body).x)))
