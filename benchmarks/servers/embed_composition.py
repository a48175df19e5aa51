"""microbatch, for ``microbatch serve embed_composition:ATTR``: the embedding example
(one ``embed`` stage, one worker, ``BENCH_TORCH_THREADS`` PyTorch threads) with its
batches composed two ways: ``fifo`` (up to 32 texts in arrival order, today's
behaviour) and ``grouped`` (a padded-token budget, texts of similar length together).
Endpoint: ``POST /predict``; health: ``GET /health/ready``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: ``examples``
from examples.embeddings import make_service

_THREADS = int(os.environ.get("BENCH_TORCH_THREADS", "1"))

fifo = make_service(threads=_THREADS, split=False, composition=False)
grouped = make_service(threads=_THREADS, split=False, composition=True)
