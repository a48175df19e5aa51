"""LitServe with one inference worker, max batch 32, batch timeout 10 ms, the embedding model.

Run: ``python embed_litserve.py PORT``. Endpoint: ``POST /predict``; health:
``GET /health`` -> 200 once the worker is ready. ``accelerator="cpu"``,
``workers_per_device=1``; ``batch`` / ``unbatch`` keep lists.
"""

import sys
from pathlib import Path
from typing import Any

import litserve as ls

sys.path.insert(0, str(Path(__file__).parent))
from embedding import MAX_BATCH, MAX_WAIT_MS, Embedder


class Embed(ls.LitAPI):
    """Decodes one body, embeds a list of them, encodes one reply."""

    def setup(self, device: str) -> None:
        self.embedder = Embedder()

    # Not annotated on purpose: LitServe turns these annotations into the endpoint's types.
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        return request

    def batch(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(inputs)

    def predict(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.embedder.reply(bodies)

    def unbatch(self, outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(outputs)

    def encode_response(self, output):  # type: ignore[no-untyped-def]
        return output


def make_server() -> ls.LitServer:
    """Batch settings on the API (LitServe >= 0.2.11) or, before that, on the server."""
    settings = {"max_batch_size": MAX_BATCH, "batch_timeout": MAX_WAIT_MS / 1000}
    try:
        api = Embed(**settings)
    except TypeError:
        return ls.LitServer(Embed(), accelerator="cpu", workers_per_device=1, **settings)
    return ls.LitServer(api, accelerator="cpu", workers_per_device=1)


if __name__ == "__main__":
    make_server().run(port=int(sys.argv[1]), generate_client_file=False)
