"""A request's body, read whole under its size and time limits.

The body is refused (413) as soon as more than the limit has arrived, or as soon as
``Content-Length`` declares more; one that arrives too slowly gets 408, unless the
server keeps that deadline itself (the body-deadline extension).
"""

from __future__ import annotations

import asyncio
import sys

from .asgi import BODY_DEADLINE_EXTENSION, Receive, Scope, extension, header
from .status import BadRequest, BodyTooLarge, BodyTooSlow

__all__ = ["ClientDisconnected", "read_body"]


class ClientDisconnected(Exception):
    """The client went away before its request's body had arrived whole."""


async def read_body(scope: Scope, receive: Receive, limit: int, timeout_s: float) -> bytes:
    """The whole body of the request: at most ``limit`` bytes, within ``timeout_s``.

    Raises:
        BadRequest: ``Content-Length`` is not a number.
        BodyTooLarge: The body is (or is declared) over ``limit`` bytes.
        BodyTooSlow: The body did not arrive within ``timeout_s``.
        ClientDisconnected: The client went away before the body's end.
    """
    declared = header(scope, b"content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if length > limit:
            raise BodyTooLarge(f"the body has {length} bytes; the limit is {limit}")
    if extension(scope, BODY_DEADLINE_EXTENSION) is not None:
        return await _receive_body(receive, limit)  # the server keeps the deadline
    try:
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(timeout_s):
                return await _receive_body(receive, limit)
        return await asyncio.wait_for(_receive_body(receive, limit), timeout_s)
    except asyncio.TimeoutError:
        raise BodyTooSlow(f"the body did not arrive within {timeout_s} s") from None


async def _receive_body(receive: Receive, limit: int) -> bytes:
    """The whole body, refused as soon as more than ``limit`` bytes have arrived."""
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False) and message["type"] == "http.request":
        if len(body) > limit:
            raise BodyTooLarge(f"the body is over the limit of {limit} bytes")
        return body
    chunks = [body]
    received = len(body)
    while message.get("more_body", False):
        if received > limit:
            raise BodyTooLarge(f"the body is over the limit of {limit} bytes")
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        chunks.append(chunk)
        received += len(chunk)
    if message["type"] == "http.disconnect":
        raise ClientDisconnected
    if received > limit:
        raise BodyTooLarge(f"the body is over the limit of {limit} bytes")
    return b"".join(chunks)
