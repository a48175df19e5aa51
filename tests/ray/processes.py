"""The process table: what a test started, and waiting (without polling) for it to end."""

from __future__ import annotations

import contextlib
import os
import select
import time
from pathlib import Path


def descendants(root: int) -> set[int]:
    """Live (not zombie) processes below ``root``, at any depth."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    """Wait until every process in ``pids`` has exited; return those still alive."""
    handles: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            handles[os.pidfd_open(pid)] = pid
    give_up = time.monotonic() + timeout_s
    try:
        while handles:
            left = give_up - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(list(handles), [], [], left)
            for fd in ready:
                os.close(fd)
                del handles[fd]
        return {pid for pid in handles.values() if not _zombie(pid)}
    finally:
        for fd in handles:
            os.close(fd)


def _zombie(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"
