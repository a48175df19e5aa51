"""Messages between the serving process and its workers, over a duplex pipe.

One message is a pickle (protocol 5) whose large buffers — numpy arrays, bytes —
travel out of band as frames of their own, so they are not copied into the pickle
stream. Only our own processes are on these pipes: nothing here ever reads data
that came from the network.
"""

from __future__ import annotations

import pickle
import struct
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["receive", "send"]

_COUNT = struct.Struct("<I")


def send(conn: Connection, message: Any) -> None:
    """Send ``message``: a header frame, then one frame per out-of-band buffer."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    conn.send_bytes(_COUNT.pack(len(buffers)) + body)
    for buffer in buffers:
        conn.send_bytes(buffer.raw())


def receive(conn: Connection) -> Any:
    """Receive one message sent by :func:`send` (blocks until it is complete)."""
    head = conn.recv_bytes()
    (count,) = _COUNT.unpack_from(head)
    buffers = [conn.recv_bytes() for _ in range(count)]
    return pickle.loads(memoryview(head)[_COUNT.size :], buffers=buffers)
