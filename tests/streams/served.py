"""Services the HTTP stream tests serve (``microbatch serve tests.streams.served:...``)."""

from __future__ import annotations

from microbatch import Service, Stage

from .models import Counter, Slow

service = Service(Stage(Counter, mode="thread", max_batch_size=1), name="counter")
"""One item at a time: a stream that is not left blocks every other."""

bounded = Service(
    Stage(Counter, mode="thread", max_batch_size=1, max_buffered_chunks=64), name="counter"
)
"""The same, with at most 64 chunks per stream unread by its client."""

slow = Service(Stage(Slow, mode="thread", max_batch_size=8), name="slow", grace_s=20.0)
"""20 ms per step."""
