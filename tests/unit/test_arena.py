"""The shared-memory arena: its files, their lifecycle, reads and writes."""

from __future__ import annotations

import gc
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from microbatch.pipeline import arena as arena_module
from microbatch.pipeline.arena import SHM_DIR, Arena

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")


def mine() -> set[str]:
    """The arena files of this process in /dev/shm."""
    return {p.name for p in SHM_DIR.glob(f"microbatch-{os.getpid()}-*")}


def test_files_are_private_fresh_and_named_by_the_serving_process() -> None:
    before = mine()
    arena = Arena.create(2)
    assert arena is not None
    try:
        assert len(arena.names) == 4 and set(arena.names) == mine() - before
        for name in arena.names:
            info = os.stat(SHM_DIR / name)
            assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
    finally:
        arena.close()
    assert mine() == before


def test_unlink_removes_the_names_and_the_open_files_still_carry_data() -> None:
    arena = Arena.create(1)
    assert arena is not None
    worker = Arena.attach(arena.names)
    try:
        arena.unlink()
        assert not mine() & set(arena.names)
        data = np.arange(100_000, dtype=np.uint8)
        out = arena.outgoing(0)
        out.reserve(data.nbytes)
        out.write(0, memoryview(data))
        assert bytes(worker.incoming(0).read(0, data.nbytes)) == data.tobytes()
    finally:
        worker.close()
        arena.close()


def test_a_reader_follows_a_file_that_its_writer_grew() -> None:
    arena = Arena.create(1)
    assert arena is not None
    worker = Arena.attach(arena.names)
    try:
        reply, received = worker.outgoing(0), arena.incoming(0)
        for size in (10, 70_000, 3_000_000, 100):
            data = os.urandom(size)
            reply.reserve(size)
            reply.write(0, memoryview(data))
            assert bytes(received.read(0, size)) == data
            with received.reader() as reader:
                assert bytes(reader.read(0, size)) == data
        with pytest.raises(OSError, match="outside the segment"):
            received.read(1 << 30, 10)
    finally:
        worker.close()
        arena.close()


def test_what_a_read_returns_is_a_copy_that_the_next_write_does_not_touch() -> None:
    arena = Arena.create(1)
    assert arena is not None
    worker = Arena.attach(arena.names)
    try:
        out = arena.outgoing(0)
        out.reserve(4)
        out.write(0, memoryview(b"abcd"))
        first = worker.incoming(0).read(0, 4)
        out.write(0, memoryview(b"wxyz"))
        assert bytes(first) == b"abcd"
        memoryview(first)[0] = ord("A")  # and it is writable
    finally:
        worker.close()
        arena.close()


def test_an_arena_dropped_without_close_unlinks_its_names() -> None:
    arena = Arena.create(1)
    assert arena is not None
    names = set(arena.names)
    assert names <= mine()
    del arena
    gc.collect()
    assert not names & mine()


def test_without_dev_shm_there_is_no_arena(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arena_module, "SHM_DIR", Path("/nonexistent-shm-dir"))
    assert Arena.create(2) is None
