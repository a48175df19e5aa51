"""Under ``microbatch serve`` a stream's chunks after its first are written straight
to its connection, a step's chunks for every stream in one callback of the event
loop (the ``microbatch.write_body`` scope extension), rather than by each stream's
writer task in a turn of its own. What the client gets is the same: every chunk
once, in order, then the end; a chunk the connection cannot take now (the client
reads slowly) goes back to the task, which sends it and the next ones with ``send``
(waiting for the client) until it can hand over again.

Every await is bounded in real time.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from microbatch.http.asgi import BODY_WRITER_EXTENSION, DISCONNECT_EXTENSION, Message
from microbatch.http.streams import NDJSON, send_stream
from microbatch.step_execution import InlineStepRunner, StepExecutor
from microbatch.stepping import StepLoop
from microbatch.testing import FakeClock

from .models import Counter

BOUND_S = 20.0


class Connection:
    """Records what is sent (``send``) and written (``write``), in order; ``write``
    refuses (nothing written) on the calls numbered in ``refuse``."""

    def __init__(self, refuse: set[int]) -> None:
        self.out: list[tuple[str, bytes]] = []
        self.refuse = refuse
        self.writes = 0

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            self.out.append(("send", message["body"]))

    def write(self, body: bytes) -> bool:
        self.writes += 1
        if self.writes in self.refuse:
            return False
        self.out.append(("write", body))
        return True

    def scope(self) -> dict[str, Any]:
        return {
            "type": "http",
            "headers": [],
            "extensions": {
                DISCONNECT_EXTENSION: {"register": lambda callback: None},
                BODY_WRITER_EXTENSION: {"write": self.write},
            },
        }

    def messages(self) -> list[dict[str, Any]]:
        lines = b"".join(body for _, body in self.out).splitlines()
        return [json.loads(line) for line in lines]


async def _never() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def _serve(item: str, connection: Connection) -> int:
    loop = StepLoop(InlineStepRunner(StepExecutor(Counter())), max_active=4, clock=FakeClock())
    try:
        return await asyncio.wait_for(
            send_stream(connection.scope(), _never, connection.send, loop.open(item), NDJSON),
            BOUND_S,
        )
    finally:
        await asyncio.wait_for(loop.close(), BOUND_S)


async def test_chunks_after_the_first_are_written_directly_in_order() -> None:
    connection = Connection(refuse=set())
    assert await _serve("a:6", connection) == 200
    assert connection.messages() == [
        *({"chunk": f"a-{k}"} for k in range(6)),
        {"end": {"status": "complete", "chunks": 6}},
    ]
    kinds = [kind for kind, _ in connection.out]
    assert kinds[0] == "send" and kinds[-1] == "send"  # the first chunk, the end
    assert "write" in kinds


async def test_the_last_chunk_goes_out_with_the_end_in_one_write() -> None:
    connection = Connection(refuse=set())
    assert await _serve("a:6", connection) == 200
    kind, body = connection.out[-1]
    assert kind == "send"  # by the task, which knows the end
    assert [json.loads(line) for line in body.splitlines()] == [
        {"chunk": "a-5"},
        {"end": {"status": "complete", "chunks": 6}},
    ]
    assert [kind for kind, _ in connection.out].count("send") == 2  # the first chunk too


async def test_what_the_connection_refuses_goes_back_to_the_task_in_order() -> None:
    connection = Connection(refuse={2, 3})
    assert await _serve("a:8", connection) == 200
    assert connection.messages() == [
        *({"chunk": f"a-{k}"} for k in range(8)),
        {"end": {"status": "complete", "chunks": 8}},
    ]
    kinds = [kind for kind, _ in connection.out]
    # Refused, the chunks went by send; then the writer took over again.
    assert kinds.count("send") >= 4 and kinds[-2] == "write"


async def test_an_error_after_direct_writes_is_the_final_message() -> None:
    connection = Connection(refuse=set())
    assert await _serve("a:9:fail@5", connection) == 200
    *chunks, last = connection.messages()
    assert chunks == [{"chunk": f"a-{k}"} for k in range(5)]
    assert last["error"]["error"] == "ItemError" and "failed at step 5" in last["error"]["message"]


async def test_without_the_extension_every_chunk_goes_by_send() -> None:
    connection = Connection(refuse=set())
    scope = connection.scope()
    del scope["extensions"][BODY_WRITER_EXTENSION]
    loop = StepLoop(InlineStepRunner(StepExecutor(Counter())), max_active=4, clock=FakeClock())
    stream = loop.open("a:5")
    sent = await asyncio.wait_for(
        send_stream(scope, _never, connection.send, stream, NDJSON), BOUND_S
    )
    await asyncio.wait_for(loop.close(), BOUND_S)
    assert sent == 200 and {kind for kind, _ in connection.out} == {"send"}
    assert connection.messages()[-1] == {"end": {"status": "complete", "chunks": 5}}
