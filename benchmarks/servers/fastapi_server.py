"""FastAPI + uvicorn without batching: every request runs the model alone.

Run: ``python fastapi_server.py PORT``. One uvicorn worker; the endpoint is a plain
``def`` (it runs in uvicorn's thread pool, so the event loop keeps accepting), and a
lock admits one model call at a time: one model worker, like one accelerator.
Health: ``GET /health`` -> 200.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

sys.path.insert(0, str(Path(__file__).parent))
from workloads import load

app = FastAPI()
workload = load()
model_lock = threading.Lock()


@app.get("/health")
def health() -> dict[str, str]:
    """Ready as soon as the process serves."""
    return {"status": "ok"}


@app.post("/predict")
def predict(body: dict[str, Any]) -> dict[str, Any]:
    """Run the model on this one request (a batch of one)."""
    with model_lock:
        return workload.predict([body])[0]


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
