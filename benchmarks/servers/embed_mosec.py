"""MOSEC with one model worker, max batch 32, max wait 10 ms, the embedding model.

Run: ``python embed_mosec.py --address 127.0.0.1 --port PORT`` (MOSEC reads its own
flags from argv). Endpoint: ``POST /inference``; health: ``GET /`` -> 200 (the port
opens only when the worker is up). JSON in and out, MOSEC's defaults otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mosec import Server, Worker

sys.path.insert(0, str(Path(__file__).parent))
from embedding import MAX_BATCH, MAX_WAIT_MS, Embedder


class Embed(Worker):
    """Gets a list of decoded JSON bodies (max_batch_size > 1), returns replies."""

    def __init__(self) -> None:
        super().__init__()
        self.embedder = Embedder()

    def forward(self, data: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.embedder.reply(data)


if __name__ == "__main__":
    server = Server()
    server.append_worker(Embed, num=1, max_batch_size=MAX_BATCH, max_wait_time=int(MAX_WAIT_MS))
    server.run()
