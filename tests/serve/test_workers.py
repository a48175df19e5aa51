"""``serve --workers N``: the relay between HTTP processes and the hub.

In-process tests drive a Hub and a RelayTarget over a real socket pair; end-to-end
tests start ``microbatch serve --workers 2`` and kill its processes. Timeouts are
hang guards, never pass criteria.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pickle
import re
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from microbatch import Model, Service, Stage, batch
from microbatch.errors import DeadlineExceeded, Overloaded, RemoteError, StageFailed
from microbatch.http.metrics import RequestCollector, RequestCounts
from microbatch.loading import as_servable
from microbatch.serve.front import RelayTarget
from microbatch.serve.hub import Hub
from microbatch.serve.relay import Channel, Message, pack_outcome, unpack_outcome
from tests.server_process import serve_command, stop, url_from_first_line

from .test_server import HANG_GUARD_S, ROOT, _post_all, _until_metrics, run_cli

# -- outcomes --------------------------------------------------------------------


def test_a_result_crosses_as_it_is() -> None:
    assert unpack_outcome(pack_outcome(True, {"y": [1.5, 2]})) == {"y": [1.5, 2]}


def test_microbatch_errors_cross_as_they_are() -> None:
    with pytest.raises(Overloaded, match="full"):
        unpack_outcome(pack_outcome(False, Overloaded("the queue is full")))


class _Unreadable(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickle cannot rebuild it from args
        super().__init__(f"{a}/{b}")


def test_any_other_error_crosses_as_a_remote_error_with_its_type_name() -> None:
    with pytest.raises(RemoteError) as caught:
        unpack_outcome(pack_outcome(False, _Unreadable(1, 2)))
    assert caught.value.type_name == "_Unreadable"
    assert caught.value.message == "1/2"


def test_a_result_that_cannot_be_pickled_fails_its_own_item() -> None:
    with pytest.raises(RemoteError, match="cannot be pickled"):
        unpack_outcome(pack_outcome(True, lambda: None))


# -- the channel -----------------------------------------------------------------


class _Inbox(list[Message]):
    """The messages channels delivered to the test, and a wait for them."""

    def __init__(self) -> None:
        super().__init__()
        self._arrived = asyncio.Event()

    def append(self, message: Message) -> None:
        super().append(message)
        self._arrived.set()

    async def holding(self, count: int) -> None:
        """Until ``count`` messages have arrived (bounded by the hang guard)."""
        async with asyncio.timeout(HANG_GUARD_S):
            while len(self) < count:
                self._arrived.clear()
                await self._arrived.wait()


async def _channel_pair() -> tuple[Channel, Channel, _Inbox]:
    loop = asyncio.get_running_loop()
    a_sock, b_sock = socket.socketpair()
    received = _Inbox()
    a = Channel(received.append, lambda: None)
    b = Channel(received.append, lambda: None)
    await loop.connect_accepted_socket(lambda: a, a_sock)
    await loop.connect_accepted_socket(lambda: b, b_sock)
    return a, b, received


async def _until(condition: Any) -> None:
    """Until ``condition()`` (bounded): for state in this event loop that offers
    no event of its own (a relay's readiness, the hub's counters)."""
    give_up = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < give_up, "hang guard"
        await asyncio.sleep(0.001)


async def test_messages_posted_in_one_turn_arrive_in_order_in_one_frame() -> None:
    a, b, received = await _channel_pair()
    frames = 0
    feed = b.data_received

    def counting(data: bytes) -> None:
        nonlocal frames
        frames += 1
        feed(data)

    b.data_received = counting  # type: ignore[method-assign]
    for i in range(100):
        a.post(("n", i))
    await received.holding(100)
    assert received == [("n", i) for i in range(100)]
    assert frames == 1
    a.close()
    b.close()


async def test_frames_split_anywhere_are_put_back_together() -> None:
    received: list[Message] = []
    channel = Channel(received.append, lambda: None)
    big = bytes(range(256)) * 1000
    stream = b""
    for messages in ([("a", 1)], [("b", big), ("c", 3)], [("d", None)]):
        payload = pickle.dumps(messages)
        stream += len(payload).to_bytes(8, "little") + payload
    for cut in range(0, len(stream), 997):
        channel.data_received(stream[cut : cut + 997])
    assert received == [("a", 1), ("b", big), ("c", 3), ("d", None)]


async def test_a_large_message_does_not_block_either_side() -> None:
    """Both sides send 8 MiB at once (more than a socket buffer holds) and both
    get everything: writes are buffered, never blocking the event loop."""
    a, b, received = await _channel_pair()
    big = b"x" * (8 * 1024 * 1024)
    a.post(("from a", big))
    b.post(("from b", big))
    await received.holding(2)
    assert sorted(m[0] for m in received) == ["from a", "from b"]
    a.close()
    b.close()


# -- hub and relay target ----------------------------------------------------------


class _Gate:
    """Holds the slow batches of the functions below until the test lets them go,
    and tells the test when one has started: events, not sleeps."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.go = asyncio.Event()

    async def hold(self) -> None:
        self.started.set()
        await self.go.wait()

    async def running(self) -> None:
        """Until a batch holds (bounded by the hang guard)."""
        async with asyncio.timeout(HANG_GUARD_S):
            await self.started.wait()


_gate = _Gate()


@pytest.fixture
def gate() -> _Gate:
    """A fresh gate for this test's event loop; the functions below wait at it."""
    global _gate
    _gate = _Gate()
    return _gate


@batch(max_batch_size=8, max_latency_ms=5)
async def _double(xs: list[float]) -> list[float]:
    if any(x < 0 for x in xs):
        await _gate.hold()  # a slow batch: the next one waits behind it
    return [2 * x for x in xs]


@batch(max_batch_size=8, max_latency_ms=5, max_concurrent_batches=1)
async def _one_at_a_time(xs: list[float]) -> list[float]:
    computed.extend(xs)
    await _gate.hold()
    return [2 * x for x in xs]


computed: list[float] = []


@asynccontextmanager
async def _relayed(function: Any, fronts: int = 2) -> AsyncIterator[tuple[Hub, list[RelayTarget]]]:
    target = function if isinstance(function, Service) else as_servable(function)
    await target.start()
    hub = Hub(target)
    relays = []
    for index in range(fronts):
        ours, theirs = socket.socketpair()
        hello = await hub.connect(index, ours)
        relay = RelayTarget("f", float, float, theirs)
        relay.requests = RequestCollector()
        await relay.start()
        await hello
        relays.append(relay)
    try:
        yield hub, relays
    finally:
        for relay in relays:
            await relay.close()
        hub.close()
        await target.close()


async def test_items_from_every_front_share_batches_and_get_their_own_results() -> None:
    async with _relayed(_double) as (hub, relays):
        xs = [float(i) for i in range(64)]
        results = await asyncio.gather(
            *(relays[i % 2].submit(x, deadline=None) for i, x in enumerate(xs))
        )
        stats = hub.target.stats().stages[0].batching
    assert results == [2 * x for x in xs]
    assert stats.items == 64
    assert stats.mean_batch_size > 1


async def test_a_deadline_is_kept_by_the_hub(gate: _Gate) -> None:
    async with _relayed(_double) as (_, relays):
        slow = asyncio.ensure_future(relays[0].submit(-1.0, deadline=None))
        await gate.running()
        with pytest.raises(DeadlineExceeded):
            await relays[1].submit(1.0, deadline=time.monotonic() + 0.05)
        gate.go.set()
        assert await slow == -2.0


async def test_a_cancelled_item_is_never_computed(gate: _Gate) -> None:
    computed.clear()
    async with _relayed(_one_at_a_time) as (hub, relays):
        busy = asyncio.ensure_future(relays[0].submit(1.0, deadline=None))
        await gate.running()
        gone = asyncio.ensure_future(relays[1].submit(2.0, deadline=None))
        # The relay and the hub offer no event for these: bounded waits on the
        # hub's counters (the hub runs in this event loop).
        await _until(lambda: hub.target.stats().stages[0].batching.queued == 1)
        gone.cancel()
        await _until(lambda: hub.target.stats().stages[0].batching.cancelled == 1)
        gate.go.set()
        assert await busy == 2.0
        assert await relays[1].submit(3.0, deadline=None) == 6.0
    assert computed == [1.0, 3.0]


class _Held(Model):
    """Doubles each item; a batch holding a negative item waits for ``release``."""

    holding = threading.Event()  # a held batch has started
    release = threading.Event()
    computed: list[float] = []  # noqa: RUF012 - the items computed, in order

    def predict(self, batch: list[float]) -> list[float]:
        if any(x < 0 for x in batch):
            type(self).holding.set()
            type(self).release.wait(HANG_GUARD_S)
        type(self).computed.extend(batch)
        return [2 * x for x in batch]


def _held_service(max_in_flight: int = 10_000) -> Service[float, float]:
    _Held.holding = threading.Event()
    _Held.release = threading.Event()
    _Held.computed = []
    stage = Stage(
        _Held, mode="thread", max_batch_size=8, max_latency_ms=2, max_concurrent_batches=1
    )
    return Service(stage, max_in_flight=max_in_flight)


def _in_flight(hub: Hub) -> int:
    """The items the hub holds for its fronts."""
    return sum(len(link.tasks) for link in hub._links.values())


async def test_a_service_is_fed_without_a_task_per_item() -> None:
    async with _relayed(_held_service()) as (hub, relays):
        assert hub.submit_nowait is not None  # the Service's own, no coroutine
        held = asyncio.ensure_future(relays[0].submit(-1.0, deadline=None))
        await _until(_Held.holding.is_set)
        rest = [
            asyncio.ensure_future(relays[i % 2].submit(float(i), deadline=None)) for i in range(16)
        ]
        await _until(lambda: _in_flight(hub) == 17)
        in_flight = [f for link in hub._links.values() for f in link.tasks.values()]
        assert not any(isinstance(f, asyncio.Task) for f in in_flight)
        _Held.release.set()
        assert await held == -2.0
        assert await asyncio.gather(*rest) == [2.0 * i for i in range(16)]


async def test_a_refused_item_fails_alone_and_a_withdrawn_one_is_never_computed() -> None:
    async with _relayed(_held_service(max_in_flight=2)) as (hub, relays):
        held = asyncio.ensure_future(relays[0].submit(-1.0, deadline=None))
        await _until(_Held.holding.is_set)
        gone = asyncio.ensure_future(relays[1].submit(5.0, deadline=None))
        await _until(lambda: _in_flight(hub) == 2)
        with pytest.raises(Overloaded):  # the third of max_in_flight=2, refused at once
            await relays[1].submit(7.0, deadline=None)
        gone.cancel()
        await _until(lambda: _in_flight(hub) == 1)  # the hub withdrew it
        _Held.release.set()
        assert await held == -2.0
        assert await relays[0].submit(3.0, deadline=None) == 6.0
    assert _Held.computed == [-1.0, 3.0]


async def test_readiness_stats_and_the_other_fronts_counts_reach_every_front() -> None:
    async with _relayed(_double) as (hub, relays):
        relays[0].requests.record("/predict", 200, 0.01)  # type: ignore[union-attr]
        relays[0]._report_counts()
        await relays[1].submit(1.0, deadline=None)
        await _until(lambda: relays[1].requests.others.statuses)  # type: ignore[union-attr]
        assert relays[1].ready
        assert relays[1].stats().stages[0].name == hub.target.stats().stages[0].name
        others = relays[1].requests.others  # type: ignore[union-attr]
        assert others.statuses == {("/predict", 200): 1}
        hub.draining = True
        await _until(lambda: not relays[0].ready)


async def test_when_the_hub_goes_waiting_items_fail_with_503_and_the_front_is_told(
    gate: _Gate,
) -> None:
    target = as_servable(_one_at_a_time)
    await target.start()
    hub = Hub(target)
    ours, theirs = socket.socketpair()
    told: list[bool] = []
    hello = await hub.connect(0, ours)
    relay = RelayTarget("f", float, float, theirs, on_hub_lost=lambda: told.append(True))
    await relay.start()
    await hello
    waiting = asyncio.ensure_future(relay.submit(1.0, deadline=None))
    await gate.running()  # the item reached the hub, whose model holds it
    hub.close()  # as if the hub process died
    with pytest.raises(StageFailed):
        await waiting
    assert told == [True]
    assert not relay.ready
    with pytest.raises(StageFailed):
        await relay.submit(2.0, deadline=None)
    gate.go.set()
    await target.close()


def test_request_counts_add_up() -> None:
    one, two = RequestCollector(), RequestCollector()
    one.record("/predict", 200, 0.001)
    two.record("/predict", 200, 0.2)
    two.record("/predict", 422, 0.0001)
    total = RequestCounts()
    total.add(one.snapshot())
    total.add(two.snapshot())
    assert total.statuses == {("/predict", 200): 2, ("/predict", 422): 1}
    counts, seconds = total.latencies["/predict"]
    assert sum(counts) == 3
    assert seconds == pytest.approx(0.2011)


# -- end to end --------------------------------------------------------------------


def _start(
    *options: str, target: str = "tests.http.models:service"
) -> tuple[subprocess.Popen[str], str, Any]:
    """``microbatch serve --workers 2`` with its log in a file: (process, url, log)."""
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by _stop)
    # The server's stderr shares this file's offset: without O_APPEND, a seek(0) here
    # to read the log would make the server's next line overwrite its first ones.
    flags = fcntl.fcntl(log.fileno(), fcntl.F_GETFL)
    fcntl.fcntl(log.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)
    process = subprocess.Popen(
        serve_command(target, "--port", "0", "--workers", "2", *options),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    return process, url_from_first_line(process), log


def _front_pids(log: Any) -> list[int]:
    log.seek(0)
    return [int(pid) for pid in re.findall(r"HTTP process \d+ started \(pid (\d+)\)", log.read())]


def _exited(pid: int, timeout_s: float = HANG_GUARD_S) -> bool:
    """Wait (bounded) for process ``pid``, ours or not, to exit: a pidfd becomes
    readable when it does. False if it still runs after ``timeout_s``."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout_s)
        return bool(readable)
    finally:
        os.close(pidfd)


def _started_again(log: Any, fronts: int) -> list[int]:
    """The HTTP processes started so far, once there are ``fronts`` of them. The
    server's log is a file (so that its order against the URL printed on stdout is
    exact) and offers no event: this is a bounded wait on it."""
    give_up = time.monotonic() + HANG_GUARD_S
    while len(pids := _front_pids(log)) < fronts:
        if time.monotonic() >= give_up:
            log.seek(0)
            raise AssertionError(f"never {fronts} HTTP processes started; the log:\n{log.read()}")
        time.sleep(0.05)
    return pids


def _stop(process: subprocess.Popen[str], log: Any) -> None:
    stop(process, HANG_GUARD_S)
    log.close()


def test_a_killed_http_process_is_started_again_and_the_others_keep_serving() -> None:
    process, url, log = _start()
    try:
        first = _front_pids(log)
        assert len(first) == 2
        os.kill(first[0], signal.SIGKILL)
        assert _exited(first[0])
        _started_again(log, 3)
        xs = [x + 0.5 for x in range(100)]
        replies = asyncio.run(_post_all(url, xs))
        assert [r.json()["y"] for r in replies] == [2 * x for x in xs]
        log.seek(0)
        assert "exited, killed by signal SIGKILL (9)" in log.read()
    finally:
        _stop(process, log)


def test_a_killed_hub_takes_its_http_processes_with_it() -> None:
    process, _, log = _start()
    try:
        fronts = _front_pids(log)
        process.kill()
        process.wait(HANG_GUARD_S)
        assert all(_exited(pid) for pid in fronts), "an HTTP process outlived its hub"
    finally:
        _stop(process, log)


def test_metrics_count_the_requests_of_every_http_process() -> None:
    process, url, log = _start("--log-level", "info")
    try:
        xs = [x + 0.5 for x in range(300)]
        replies = asyncio.run(_post_all(url, xs))
        assert [r.status_code for r in replies] == [200] * 300
        _until_metrics(
            url,
            'microbatch_http_requests_total{route="/predict",status="200"} 300.0',
            "microbatch_batch_size_count{stage=",
        )
    finally:
        _stop(process, log)


def test_stage_routes_are_relayed_with_their_route() -> None:
    process, url, log = _start(target="tests.http.models:two_stages")
    try:
        with httpx.Client(base_url=url, timeout=HANG_GUARD_S) as client:
            whole = client.post("/predict", json={"x": 1.5})
            first = client.post("/predict/Double", json={"x": 1.5})
            second = client.post("/predict/Describe", json={"y": 4})
            wrong = client.post("/predict/Describe", json={"x": 4})
        assert (whole.json(), first.json(), second.json()) == (
            {"text": "y=3"},
            {"y": 3.0},
            {"text": "y=4"},
        )
        assert wrong.status_code == 422
    finally:
        _stop(process, log)


def test_workers_must_be_at_least_one() -> None:
    done = run_cli("serve", "tests.http.models:x", "--workers", "0")
    assert done.returncode == 2
    assert "expected an integer >= 1" in done.stderr


def test_the_url_is_printed_only_once_every_http_process_is_up() -> None:
    process, url, log = _start()
    try:
        assert len(_front_pids(log)) == 2
        assert httpx.get(url + "/health/ready", timeout=HANG_GUARD_S).status_code == 200
    finally:
        _stop(process, log)
