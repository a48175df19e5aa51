"""The pipe transport: small buffers in band, large ones through the arena or as
pipe frames; every mix of sizes arrives byte for byte, writable, owned by the receiver."""

from __future__ import annotations

import errno
import os
import pickle
import random
import threading
from collections.abc import Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microbatch.pipeline.arena import ARENA_MIN_BYTES, SHM_DIR, Arena
from microbatch.pipeline.transport import read_message, send

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")

EDGE = ARENA_MIN_BYTES
SIZES = [0, 1, EDGE - 1, EDGE, EDGE + 1, 3 * EDGE + 5, (1 << 20) + 3]


@pytest.fixture(scope="module")
def ends() -> Iterator[tuple[Connection, Connection, Arena, Arena]]:
    """A duplex pipe and both views of one two-slot arena, as in a pool."""
    serving, worker = Pipe(duplex=True)
    arena = Arena.create(2)
    assert arena is not None
    attached = Arena.attach(arena.names)
    yield serving, worker, arena, attached
    attached.close()
    arena.close()
    serving.close()
    worker.close()


def trip(
    ends: tuple[Connection, Connection, Arena, Arena], message: Any, slot: int | None, arena: bool
) -> tuple[Any, int]:
    """Send ``message`` from the serving side, decode it on the worker side; also
    returns how many bytes came through the arena."""
    serving, worker, outgoing, incoming = ends
    target = outgoing.outgoing(slot) if arena and slot is not None else None
    sender = threading.Thread(target=send, args=(serving, message, slot, target))
    sender.start()  # a large frame fills the pipe until it is read
    received = read_message(worker)
    sender.join()
    source = incoming.incoming(slot) if slot is not None else None
    return received.decode(source), received.arena_bytes


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and bool(a == b)


def array(size: int, dtype: str, layout: str, seed: int) -> np.ndarray:
    """``size`` random bytes as ``dtype``: flat, Fortran-ordered 2-D, or strided."""
    raw = np.random.default_rng(seed).integers(0, 255, size, dtype=np.uint8)
    flat = raw[: size - size % np.dtype(dtype).itemsize].view(dtype)
    if layout == "fortran" and flat.size % 2 == 0:
        return flat.reshape(2, -1).T  # contiguous, in Fortran order
    if layout == "strided":
        return flat[::2]  # not contiguous: numpy pickles it in band
    return flat


sizes = st.sampled_from(SIZES) | st.integers(0, 3 * EDGE)
arrays = st.builds(
    array,
    sizes,
    st.sampled_from(["u1", "f4", "<i8", ">f8", "c16"]),
    st.sampled_from(["flat", "fortran", "strided"]),
    st.integers(0, 2**32 - 1),
)
blobs = st.builds(lambda n, seed: random.Random(seed).randbytes(n), sizes, st.integers())
leaves = arrays | blobs | blobs.map(bytearray) | st.integers() | st.text(max_size=20)
messages = st.lists(leaves | st.lists(leaves, max_size=3).map(tuple), max_size=8)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=messages, slot=st.sampled_from([None, 0, 1]), arena=st.booleans())
def test_any_mix_of_buffer_sizes_round_trips_byte_exact(
    ends: tuple[Connection, Connection, Arena, Arena], message: Any, slot: int | None, arena: bool
) -> None:
    got, _ = trip(ends, message, slot, arena)
    # Exactly what pickle alone gives (numpy itself makes a strided big-endian
    # array native-endian on the way), byte for byte.
    assert same(pickle.loads(pickle.dumps(message, protocol=5)), got)


def test_small_buffers_stay_in_band_and_large_ones_use_the_arena(
    ends: tuple[Connection, Connection, Arena, Arena],
) -> None:
    small = np.ones(EDGE // 8 - 1, np.float64)  # one byte short of going out of band
    large = np.ones(EDGE // 8, np.float64)
    assert trip(ends, [small[:1000]], 0, arena=True)[1] == 0  # all in the header frame
    in_band = trip(ends, [small, small + 1], 0, arena=True)[1]  # so large a pickle: arena
    assert 2 * small.nbytes < in_band < 2 * small.nbytes + 1000
    assert trip(ends, [small[:1000], large], 0, arena=True)[1] == large.nbytes
    assert trip(ends, [large], 1, arena=False)[1] == 0  # no arena: pipe frames
    assert trip(ends, [large], None, arena=True)[1] == 0  # no slot: pipe frames
    big_pickle = b"x" * (2 * EDGE)  # bytes are always pickled in band
    assert trip(ends, big_pickle, 0, arena=True)[1] > len(big_pickle)


@pytest.mark.parametrize("arena", [True, False])
def test_arrays_arrive_writable_and_survive_the_next_message(
    ends: tuple[Connection, Connection, Arena, Arena], arena: bool
) -> None:
    sizes = (10, EDGE, 5 * EDGE)
    first, _ = trip(ends, [np.full(n, 1, np.uint8) for n in sizes], 0, arena)
    trip(ends, [np.full(n, 2, np.uint8) for n in sizes], 0, arena)  # same slot, same files
    for array in first:
        assert array.flags.writeable and (array == 1).all()
        array += 1


def test_a_full_dev_shm_sends_the_large_parts_as_pipe_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    serving, worker = Pipe(duplex=True)
    arena = Arena.create(1)
    assert arena is not None
    attached = Arena.attach(arena.names)

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    try:
        message = [np.arange(EDGE, dtype=np.uint16), b"z" * (2 * EDGE)]
        got, through_arena = trip((serving, worker, arena, attached), message, 0, arena=True)
        assert through_arena == 0 and same(message, got)
    finally:
        attached.close()
        arena.close()
        serving.close()
        worker.close()
