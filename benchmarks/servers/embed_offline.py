"""The embedding model alone, no serving: texts/s at each batch size, as JSON on stdout.

Run in the microbatch virtualenv (it has the example's dependencies)::

    python embed_offline.py THREADS SIZE [SIZE ...]

It builds the example's own stages (``examples/embeddings.py``: ``Tokenize`` then
``Encode``) in this process with THREADS PyTorch threads and times tokenize +
encode of batches of the benchmark's texts (cycled, so each repeat gets other
texts): the median of several batches per size after one untimed batch. It also
prints the embeddings of the first three texts, which the servers' replies are
checked against.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: ``examples``
sys.path.insert(0, str(Path(__file__).resolve().parent))
from embedding import TEXTS

from examples.embeddings import EmbedRequest, Encode, Tokenize
from microbatch.pipeline import WorkerContext

TEXTS_PER_SIZE = 256
"""Texts timed per batch size (at least 5 batches)."""


def main() -> None:
    """Measure each size; print ``{"texts_per_s": {size: rate}, "reference": [...]}``."""
    threads, sizes = int(sys.argv[1]), [int(size) for size in sys.argv[2:]]
    tokenize, encode = Tokenize(), Encode(threads=threads, device="cpu")
    tokenize.setup(WorkerContext("tokenize", 0))
    encode.setup(WorkerContext("encode", 0))
    requests = [EmbedRequest(text) for text in TEXTS]

    def run(size: int, start: int) -> None:
        batch = [requests[(start + j) % len(requests)] for j in range(size)]
        encode.predict(tokenize.predict(batch))

    rates = {}
    for size in sizes:
        run(size, 0)
        times = []
        for repeat in range(max(5, TEXTS_PER_SIZE // size)):
            began = time.perf_counter()
            run(size, repeat * size)
            times.append(time.perf_counter() - began)
        rates[size] = size / statistics.median(times)
        print(f"offline batch {size:>2}: {rates[size]:7.1f} texts/s", file=sys.stderr, flush=True)
    reference = [encode.predict(tokenize.predict([r]))[0].embedding for r in requests[:3]]
    print(json.dumps({"texts_per_s": rates, "reference": reference}))


if __name__ == "__main__":
    main()
