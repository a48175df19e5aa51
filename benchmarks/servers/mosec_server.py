"""MOSEC with one model worker, max batch 64, max wait 10 ms.

Run: ``python mosec_server.py --address 127.0.0.1 --port PORT`` (MOSEC reads its own
flags from argv). Endpoint: ``POST /inference``; health: ``GET /`` -> 200 (the port
opens only when the worker is up). MOSEC's defaults otherwise: JSON in and out,
``--timeout`` 3000 ms, capacity 1024.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mosec import Server, Worker

sys.path.insert(0, str(Path(__file__).parent))
from workloads import MAX_BATCH, MAX_WAIT_MS, load


class Model(Worker):
    """Gets a list of decoded JSON bodies (max_batch_size > 1), returns replies."""

    def __init__(self) -> None:
        super().__init__()
        self.workload = load()

    def forward(self, data: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.workload.predict(data)


if __name__ == "__main__":
    server = Server()
    server.append_worker(Model, num=1, max_batch_size=MAX_BATCH, max_wait_time=int(MAX_WAIT_MS))
    server.run()
