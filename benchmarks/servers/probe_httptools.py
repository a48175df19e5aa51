"""The floor of a Python front (issue 15): uvloop + httptools, ``{"x": float}`` decoded
with msgspec, ``{"y": 2x}`` answered at once (no batching, no app).

Run: ``python probe_httptools.py PORT``; ``POST`` anything ``{"x": float}``.
"""

from __future__ import annotations

import asyncio
import sys

import httptools
import msgspec
import uvloop


class Body(msgspec.Struct):
    x: float


class Reply(msgspec.Struct):
    y: float


decode = msgspec.json.Decoder(Body).decode
encode = msgspec.json.Encoder().encode


class Probe(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        payload = encode(Reply(2 * decode(b"".join(self.body)).x))
        self.body = []
        self.transport.write(  # type: ignore[attr-defined]
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(payload), payload)
        )


async def main(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Probe, "127.0.0.1", port)
    print(f"probe serving on http://127.0.0.1:{port}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1])))
