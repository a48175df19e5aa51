"""microbatch, for ``microbatch serve embed_microbatch:service``: the embedding example
as shipped (``examples/embeddings.py``: on a machine without a GPU one ``embed``
stage, one worker, batches of up to 32, adaptive policy) with ``BENCH_TORCH_THREADS``
PyTorch threads; ``embed_microbatch:split`` is the same model in the GPU layout, a
``tokenize`` stage then an ``encode`` stage (``make_service(split=True)``). Endpoint:
``POST /predict``; health: ``GET /health/ready``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: ``examples``
from examples.embeddings import make_service

service = make_service(threads=int(os.environ.get("BENCH_TORCH_THREADS", "1")))

split = make_service(threads=int(os.environ.get("BENCH_TORCH_THREADS", "1")), split=True)
"""The same model with tokenizing in a stage of its own, for comparison."""
