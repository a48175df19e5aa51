"""Readings from /proc about the server under test: its live children, memory
(and RSS sampled while a block runs), CPU wait, file descriptors, the sockets it
listens on or holds, and its shared-memory segments.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tests.serve.test_server import Server

__all__ = [
    "RssSamples",
    "alive",
    "children",
    "cpu_wait_s",
    "fd_count",
    "listening_tcp",
    "rss_kib",
    "sampling_rss",
    "shm_segments",
    "unix_socket_paths",
]


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
