"""What the reliability tests share: a ``microbatch serve`` child process, a small
raw HTTP/1.1 client, closed- and open-loop load, readings from /proc, and figures.

Load stays on 127.0.0.1 with at most 200 connections. Every wait is bounded by a
hang guard; the tests stop only the processes they started, by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import uvloop

from tests.conftest import long_figures
from tests.serve.test_server import Server, running

__all__ = [
    "HANG_GUARD_S",
    "HUNG_UP",
    "Connection",
    "Outcome",
    "Reply",
    "RssSamples",
    "Server",
    "Tally",
    "alive",
    "children",
    "closed_loop",
    "computed",
    "cpu_wait_s",
    "eventually",
    "fd_count",
    "get",
    "lasting",
    "listening_tcp",
    "metric",
    "open_loop",
    "percentile",
    "report",
    "rss_kib",
    "run",
    "sampling_rss",
    "serving",
    "shm_segments",
    "stop",
    "sum_samples",
    "unix_socket_paths",
]

HANG_GUARD_S = 30.0
"""Longest wait for anything; a guard against hangs, never a pass criterion."""

FIGURES: list[str] = []
"""Every figure reported in this session, printed again in pytest's summary."""

T = TypeVar("T")


def lasting(short_s: float, long_s: float) -> float:
    """A test's duration: ``long_s`` under ``pytest --long`` (the published
    figure), else ``short_s`` (the default run: the same faults, fewer seconds)."""
    return long_s if long_figures() else short_s


def run(main: Awaitable[T]) -> T:
    """Run a test's client side on uvloop (the load generator needs the speed)."""
    return uvloop.run(main)  # type: ignore[arg-type, no-any-return]


def report(name: str, **numbers: object) -> str:
    """Print a test's figure (``name: key=value ...``) and keep it for the summary."""
    line = f"{name}: " + " ".join(f"{key}={_show(value)}" for key, value in numbers.items())
    FIGURES.append(line)
    print(line, flush=True)
    return line


def _show(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        pairs = sorted(value.items(), key=str) if isinstance(value, Counter) else value.items()
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in pairs) + "}"
    return str(value)


@contextlib.contextmanager
def serving(target: str, *options: str, env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """``microbatch serve tests.reliability.models:TARGET --port 0 ...`` until the block
    ends (then SIGTERM, and SIGKILL if it has not exited within the hang guard);
    yields once it is ready. Logs at warning level unless told otherwise."""
    if "--log-level" not in options:
        options = (*options, "--log-level", "warning")
    with running(f"tests.reliability.models:{target}", *options, env=dict(env or {})) as server:
        try:
            yield server
        finally:
            if server.process.poll() is None:
                stop(server)


def stop(server: Server) -> int:
    """SIGTERM the server and wait for it (SIGKILL past the hang guard); its exit status."""
    server.process.terminate()
    try:
        return server.process.wait(HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait(HANG_GUARD_S)


# -- the client ------------------------------------------------------------------


class Reply(msgspec.Struct, frozen=True):
    """One HTTP response: status, headers (lower-case names), body, seconds taken."""

    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


class Connection:
    """One keep-alive HTTP/1.1 connection, one request at a time.

    Raw rather than httpx: the load generator runs in the test's process, on the same
    two cores as the server, and must cost little; and hostile tests need to send
    exactly the bytes they mean.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, address: tuple[str, int]) -> Connection:
        reader, writer = await asyncio.open_connection(*address, limit=1 << 20)
        return cls(reader, writer)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """Send one request and read its response (raises ConnectionError if the
        server closes the connection first)."""
        started = time.perf_counter()
        self.send(method, path, body, headers)
        return await self.read_reply(started)

    def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        head = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", f"content-length: {len(body)}"]
        head += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    async def read_reply(self, started: float) -> Reply:
        try:
            status_line = await self.reader.readuntil(b"\r\n")
            headers: dict[str, str] = {}
            while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
            raise ConnectionResetError("the server closed the connection") from error
        return Reply(int(status_line.split()[1]), headers, body, time.perf_counter() - started)

    async def post(
        self, item: object, headers: Mapping[str, str] | None = None, path: str = "/predict"
    ) -> Reply:
        """POST ``item`` as JSON."""
        all_headers = {"content-type": "application/json", **(headers or {})}
        return await self.request("POST", path, msgspec.json.encode(item), all_headers)

    def abort(self) -> None:
        """Drop the connection at once (a client that goes away)."""
        self.writer.transport.abort()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def get(address: tuple[str, int], path: str) -> Reply:
    """One GET on a fresh connection."""
    connection = await Connection.open(address)
    try:
        return await asyncio.wait_for(connection.request("GET", path), HANG_GUARD_S)
    finally:
        await connection.close()


async def metric(address: tuple[str, int], name: str, **labels: str) -> float:
    """The sum of the samples of Prometheus metric ``name`` whose labels include
    ``labels`` (e.g. ``metric(a, "microbatch_http_requests_total", status="503")``)."""
    return sum_samples((await get(address, "/metrics")).body.decode(), name, **labels)


def sum_samples(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` in a Prometheus text page, by labels."""
    total = 0.0
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        metric_name, _, label_text = sample.partition("{")
        if metric_name != name:
            continue
        found = dict(_LABEL.findall(label_text))
        if all(found.get(key) == wanted for key, wanted in labels.items()):
            total += float(value)
    return total


_LABEL = re.compile(r'(\w+)="([^"]*)"')


async def eventually(
    condition: Callable[[], Awaitable[bool]], what: str, timeout_s: float = HANG_GUARD_S
) -> float:
    """Poll ``condition`` (it reads another process's state) until true; return
    the seconds it took. Raises AssertionError naming ``what`` past the guard."""
    started = time.monotonic()
    while not await condition():
        assert time.monotonic() - started < timeout_s, f"never happened: {what}"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


# -- load ------------------------------------------------------------------------


@dataclass
class Tally:
    """What a load run sent and got back: counts by status, latencies, and lost
    requests (no response at all: a reset, or the hang guard)."""

    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    seconds: dict[int, list[float]] = field(default_factory=dict)
    lost: int = 0
    wrong: list[str] = field(default_factory=list)  # 200s carrying someone else's answer

    def add(self, reply: Reply) -> None:
        self.statuses[reply.status] += 1
        self.seconds.setdefault(reply.status, []).append(reply.seconds)

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())

    def merge(self, other: Tally) -> None:
        self.sent += other.sent
        self.statuses.update(other.statuses)
        for status, values in other.seconds.items():
            self.seconds.setdefault(status, []).extend(values)
        self.lost += other.lost
        self.wrong.extend(other.wrong)

    def p(self, q: float, status: int = 200) -> float:
        """The ``q`` quantile (0..1) of the latency of ``status`` replies, in ms."""
        return 1000 * percentile(self.seconds.get(status, []), q)

    def figure(self) -> dict[str, object]:
        return {
            "sent": self.sent,
            "answered": self.answered,
            "by_status": self.statuses,
            "lost": self.lost,
            "wrong": len(self.wrong),
        }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank quantile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


Exchange = Callable[["Connection", int], Awaitable[Reply]]
"""One request on a connection, given a unique sequence number; returns the reply."""

HUNG_UP = -1
"""The status of a reply an exchange made up after dropping the connection on purpose."""


async def closed_loop(
    address: tuple[str, int],
    clients: int,
    seconds: float,
    exchange: Exchange,
    check: Callable[[int, Reply], str | None] | None = None,
    tally: Tally | None = None,
) -> Tally:
    """``clients`` connections each sending one request after another for ``seconds``.

    Requests are numbered on from ``tally.sent + 1``. ``check(number, reply)``
    returns a complaint about a reply (kept in ``tally.wrong``) or None. A request
    that gets no response is counted lost and its client reconnects.
    """
    tally = tally if tally is not None else Tally()
    sequence = iter(range(tally.sent + 1, 1 << 62))
    until = time.monotonic() + seconds

    async def client() -> None:
        connection: Connection | None = None
        while time.monotonic() < until:
            if connection is None:
                connection = await Connection.open(address)
            number = next(sequence)
            tally.sent += 1
            try:
                reply = await asyncio.wait_for(exchange(connection, number), HANG_GUARD_S)
            except (OSError, asyncio.TimeoutError):
                tally.lost += 1
                connection.abort()
                connection = None
                continue
            tally.add(reply)
            if check is not None and (complaint := check(number, reply)) is not None:
                tally.wrong.append(complaint)
            if reply.headers.get("connection") == "close":
                await connection.close()
                connection = None
        if connection is not None:
            await connection.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return tally


# -- /proc -----------------------------------------------------------------------


def children(pid: int) -> set[int]:
    """Live (not zombie) child processes of ``pid``, except multiprocessing's
    resource tracker."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and b"resource_tracker" not in command:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def cpu_wait_s(pid: int) -> float:
    """Seconds the threads of ``pid`` have spent runnable but waiting for a CPU
    (/proc schedstat): how much a busy machine delayed it, whatever our code does."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def fd_count(pid: int) -> int:
    """Open file descriptors of ``pid``."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    return inodes


def listening_tcp(pid: int) -> list[str]:
    """``host:port`` of every TCP socket ``pid`` listens on (IPv4 and IPv6)."""
    inodes = _socket_inodes(pid)
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    host_hex, port_hex = fields[1].split(":")
                    found.append(f"{_address(host_hex, width)}:{int(port_hex, 16)}")
    return found


def _address(host_hex: str, width: int) -> str:
    raw = bytes.fromhex(host_hex)
    # /proc writes each 32-bit word in host (little-endian) order.
    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]
    packed = b"".join(words)
    if width == 8:
        return ".".join(str(b) for b in packed)
    return "[" + ":".join(packed[i : i + 2].hex() for i in range(0, 16, 2)) + "]"


def unix_socket_paths(pid: int) -> list[str]:
    """Filesystem paths of the Unix-domain sockets ``pid`` holds (unnamed ones, such
    as a socketpair, have none)."""
    inodes = _socket_inodes(pid)
    paths = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and not fields[7].startswith("@"):
            paths.append(fields[7])
    return paths


def shm_segments(pid: int) -> int:
    """Shared-memory segments (/dev/shm files) that ``pid`` maps or holds open."""
    names = set()
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            if "/dev/shm/" in line:
                names.add(line.split("/dev/shm/", 1)[1].split()[0])
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("/dev/shm/"):
                names.add(link[len("/dev/shm/") :])
    return len(names)


def computed(log: Path) -> dict[int, float]:
    """The items a model of tests.reliability.models computed, from its log: id ->
    when it started (``time.monotonic()``); warm-up items (negative ids) left out."""
    if not log.exists():
        return {}
    started = {}
    for line in log.read_text().splitlines():
        item_id, at = line.split()
        if int(item_id) >= 0:
            started.setdefault(int(item_id), float(at))
    return started


class RssSamples:
    """RSS readings of one process, in KiB, oldest first, and when they were taken
    (``time.monotonic()``)."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self.times: list[float] = []

    def between(self, since: float, until: float) -> list[int]:
        return [
            kib for kib, at in zip(self.samples, self.times, strict=True) if since <= at < until
        ]


@contextlib.contextmanager
def sampling_rss(server: Server, every_s: float = 0.02) -> Iterator[RssSamples]:
    """Sample the server's RSS (KiB) in a thread while the block runs."""
    found = RssSamples()
    stop = threading.Event()
    pid = server.process.pid

    def sample() -> None:
        while True:
            found.times.append(time.monotonic())
            found.samples.append(rss_kib(pid))
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        yield found
    finally:
        stop.set()
        thread.join()
        found.times.append(time.monotonic())
        found.samples.append(rss_kib(pid))


@dataclass(frozen=True)
class Outcome:
    """One request of an open-loop run: its number, when it was due (seconds from
    the start), its status (0: no response), the seconds from then to its response,
    and from when it was sent (later, if the client was behind) to its response."""

    number: int
    at: float
    status: int
    seconds: float
    round_trip: float
    complaint: str | None = None  # what ``check`` found wrong with the reply


async def open_loop(
    address: tuple[str, int],
    phases: list[tuple[float, float]],
    exchange: Exchange,
    outcomes: list[Outcome],
    connections: int = 200,
    check: Callable[[int, Reply], str | None] | None = None,
) -> None:
    """Send requests at a fixed rate, phase after phase (``(rate per second,
    seconds)``), on time whatever the server does, over ``connections`` connections
    opened first (an arrival that finds them all busy waits for one). Appends one
    :class:`Outcome` per request (with ``check(number, reply)``'s complaint); its
    time counts from when it was due."""
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(connections):
        idle.put_nowait(await Connection.open(address))
    started = time.monotonic()

    async def one(number: int, at: float) -> None:
        connection = await idle.get()
        try:
            reply = await asyncio.wait_for(exchange(connection, number), HANG_GUARD_S)
        except (OSError, asyncio.TimeoutError):
            late = time.monotonic() - started - at
            outcomes.append(Outcome(number, at, 0, late, late))
            connection.abort()
            idle.put_nowait(await Connection.open(address))
            return
        late = time.monotonic() - started - at
        complaint = None if check is None else check(number, reply)
        outcomes.append(Outcome(number, at, reply.status, late, reply.seconds, complaint))
        if reply.status == HUNG_UP:
            connection = await Connection.open(address)
        idle.put_nowait(connection)

    tasks = []
    phase_start = 0.0
    for rate, seconds in phases:
        for k in range(int(rate * seconds)):
            at = phase_start + k / rate
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            tasks.append(asyncio.ensure_future(one(len(tasks) + 1, at)))
        phase_start += seconds
    await asyncio.gather(*tasks)
    while not idle.empty():
        await idle.get_nowait().close()
