"""FastAPI + uvicorn without batching: every request embeds its one text alone.

Run: ``python embed_fastapi.py PORT``. One uvicorn worker; the endpoint is a plain
``def`` (uvicorn's thread pool), and a lock admits one model call at a time: one
model worker. Health: ``GET /health`` -> 200 once the model is loaded.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

sys.path.insert(0, str(Path(__file__).parent))
from embedding import Embedder

app = FastAPI()
embedder = Embedder()
model_lock = threading.Lock()


@app.get("/health")
def health() -> dict[str, str]:
    """Ready as soon as the process serves (the model loaded at import)."""
    return {"status": "ok"}


@app.post("/predict")
def predict(body: dict[str, Any]) -> dict[str, Any]:
    """Embed this one request's text (a batch of one)."""
    with model_lock:
        return embedder.reply([body])[0]


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
