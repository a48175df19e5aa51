"""Under ``microbatch serve`` a stream's chunks are written straight to its
connection, a step's chunks for every stream in one callback of the event loop,
rather than by each stream's writer task in a turn of its own: through the ASGI
app (the ``microbatch.write_body`` scope extension) the chunks after the first;
on the server's own connections (a :class:`StreamOut` that ``begins_now``) the
first one too, with the head. What the client gets is the same: every chunk once,
in order, then the end; a chunk the connection cannot take now (the client reads
slowly, or left) goes back to the task, which sends it and the next ones with
``send`` (waiting for the client) until it can hand over again.

Every await is bounded in real time.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from microbatch.errors import ItemError
from microbatch.http.asgi import BODY_WRITER_EXTENSION, DISCONNECT_EXTENSION, Message
from microbatch.http.streams import NDJSON, send_stream, write_stream
from microbatch.step_contract import StepDone, StepJob
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


class Out:
    """A :class:`~microbatch.http.streams.StreamOut` that records each call, and
    sends the head from a callback (``begin_now``) unless told the client is gone."""

    writes_now = True
    begins_now = True

    def __init__(self, gone: bool = False) -> None:
        self.gone = gone
        self.calls: list[tuple[str, bytes]] = []

    async def begin(self, first: bytes) -> None:
        self.calls.append(("begin", first))

    def begin_now(self, first: bytes) -> bool:
        if self.gone:
            return False
        self.calls.append(("begin_now", first))
        return True

    async def more(self, body: bytes) -> None:
        self.calls.append(("more", body))

    def write_now(self, body: bytes) -> bool:
        self.calls.append(("write_now", body))
        return True

    async def end(self, final: bytes) -> None:
        self.calls.append(("end", final))

    def messages(self) -> list[dict[str, Any]]:
        lines = b"".join(body for _, body in self.calls).splitlines()
        return [json.loads(line) for line in lines]


class LaterRunner(InlineStepRunner):
    """Steps in the event loop's thread a turn after each step is handed over, as a
    runner in another thread or process does (a stream's writer is waiting by then)."""

    async def advance(self, job: StepJob) -> StepDone:
        await asyncio.sleep(0)
        return self.executor.advance(job)


async def _write(item: str, out: Out) -> int:
    loop = StepLoop(LaterRunner(StepExecutor(Counter())), max_active=4, clock=FakeClock())
    try:
        return await asyncio.wait_for(write_stream(out, loop.open(item), NDJSON), BOUND_S)
    finally:
        await asyncio.wait_for(loop.close(), BOUND_S)


async def test_the_head_and_first_chunk_go_out_from_the_callback_too() -> None:
    out = Out()
    assert await _write("a:6", out) == 200
    assert out.messages() == [
        *({"chunk": f"a-{k}"} for k in range(6)),
        {"end": {"status": "complete", "chunks": 6}},
    ]
    kinds = [kind for kind, _ in out.calls]
    # The task wrote only the end (with the last chunk): it woke once.
    assert kinds == ["begin_now", *["write_now"] * 4, "end"]
    assert out.calls[0][1] == b'{"chunk":"a-0"}\n'


async def test_a_client_gone_before_the_head_leaves_it_to_the_task() -> None:
    out = Out(gone=True)
    assert await _write("a:4", out) == 200
    assert out.messages() == [
        *({"chunk": f"a-{k}"} for k in range(4)),
        {"end": {"status": "complete", "chunks": 4}},
    ]
    assert out.calls[0][0] == "begin"  # the task sent the head


async def test_a_stream_of_one_chunk_sends_it_with_its_end() -> None:
    out = Out()
    assert await _write("a:1", out) == 200
    assert out.calls == [
        ("begin", b""),
        ("end", b'{"chunk":"a-0"}\n{"end":{"status":"complete","chunks":1}}\n'),
    ]


async def test_an_error_before_any_chunk_is_raised_and_nothing_is_sent() -> None:
    out = Out()
    with pytest.raises(ItemError, match="failed at step 0"):
        await _write("a:3:fail@0", out)
    assert out.calls == []


async def test_an_error_after_chunks_from_the_callback_is_the_final_message() -> None:
    out = Out()
    assert await _write("a:5:fail@3", out) == 200
    *chunks, last = out.messages()
    assert chunks == [{"chunk": f"a-{k}"} for k in range(3)]
    assert last["error"]["status"] == 422 and "failed at step 3" in last["error"]["message"]
    assert [kind for kind, _ in out.calls].count("begin_now") == 1
