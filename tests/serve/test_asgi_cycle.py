"""A streamed ASGI response without a length: chunked on HTTP/1.1; on HTTP/1.0 (no
chunked framing there) the body runs to the close."""

from __future__ import annotations

from typing import Any

import pytest

from microbatch.serve.asgi_cycle import AsgiCycle


class Owner:
    """The connection side of one cycle: what it was told and given."""

    writing_paused = False

    def __init__(self) -> None:
        self.written = b""
        self.closes_after = False
        self.completed: list[int] = []

    def write(self, data: bytes) -> None:
        self.written += data

    def hold_body(self, held: bool) -> None:
        pass

    def response_complete(self, status: int) -> None:
        self.completed.append(status)

    def abort(self) -> None:
        raise AssertionError("not aborted")

    async def drained(self) -> None:
        pass

    def close_after_response(self) -> None:
        self.closes_after = True


async def stream_two_parts(version: str, connection: bytes) -> Owner:
    owner = Owner()
    scope: dict[str, Any] = {"http_version": version, "method": "GET", "path": "/s"}
    cycle = AsgiCycle(owner, scope, head_only=False, connection=connection)
    await cycle.send({"type": "http.response.start", "status": 200, "headers": []})
    await cycle.send({"type": "http.response.body", "body": b"one", "more_body": True})
    await cycle.send({"type": "http.response.body", "body": b"two", "more_body": False})
    assert owner.completed == [200]
    return owner


async def test_http_1_1_is_chunked() -> None:
    owner = await stream_two_parts("1.1", b"")
    head, _, body = owner.written.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert body == b"3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n"
    assert not owner.closes_after


@pytest.mark.parametrize("connection", [b"", b"connection: keep-alive\r\n"])
async def test_http_1_0_runs_to_the_close(connection: bytes) -> None:
    owner = await stream_two_parts("1.0", connection)
    head, _, body = owner.written.partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head and b"content-length" not in head
    assert b"connection: close" in head and b"keep-alive" not in head
    assert body == b"onetwo"
    assert owner.closes_after
