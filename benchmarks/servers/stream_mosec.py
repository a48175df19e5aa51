"""MOSEC server-sent events of the simulated step model, one worker, dynamic
batching (max batch 64, max wait 10 ms): ``forward`` gets a batch and sends one
event per item per step until the batch's longest item ends (lockstep).

Run: ``python stream_mosec.py --address 127.0.0.1 --port PORT``; ``POST /inference``
with ``{"n": chunks}`` answers ``text/event-stream``; each chunk is one event
``data: @``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mosec import Server, SSEWorker

sys.path.insert(0, str(Path(__file__).parent))
from stream_models import CHUNK, MAX_ACTIVE, simulate_step


class Steps(SSEWorker):
    """Lockstep over the batch, one SSE event per live item per step."""

    def forward(self, data: list[dict[str, Any]]) -> list[dict[str, Any]]:
        lengths = [int(body["n"]) for body in data]
        for position in range(1, max(lengths) + 1):
            simulate_step(len(lengths))
            for index, n in enumerate(lengths):
                if position <= n:
                    self.send_stream_event(CHUNK, index=index)
        return [{"chunks": n} for n in lengths]


if __name__ == "__main__":
    server = Server()
    server.append_worker(Steps, num=1, max_batch_size=MAX_ACTIVE, max_wait_time=10)
    server.run()
