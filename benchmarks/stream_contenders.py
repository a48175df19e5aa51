"""The streaming servers ``benchmarks/streaming.py`` compares over HTTP: how each
is started (a ``harness.Contender``), where a stream is asked for, the body it
takes, and whether it batches step-wise."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from harness import ROOT, Contender


@dataclass(frozen=True)
class HttpContender:
    """A streaming server: how it is started, where a stream is asked for, and
    whether it batches step-wise."""

    label: str
    server: Contender
    path: str
    env: dict[str, str]
    stepwise: bool
    openai: bool = False

    def body(self, length: int) -> bytes:
        """The request for a stream of ``length`` chunks: an OpenAI chat completion of
        ``max_tokens`` chunks, or microbatch's bare number (its item type is ``int``),
        or ``{"n": length}``."""
        item: object
        if self.openai:
            item = {
                "model": "steps",
                "messages": [{"role": "user", "content": "go"}],
                "max_tokens": length,
                "stream": True,
            }
        elif self.server.framework == "microbatch":
            item = length
        else:
            item = {"n": length}
        return json.dumps(item).encode()


@dataclass(frozen=True)
class InThisEnvironment(Contender):
    """A server run by this interpreter, from the environment it runs in (Ray is
    installed there by the ``test`` extra: too heavy for a virtualenv of its own)."""

    @property
    def venv(self) -> Path:
        return Path(sys.prefix)

    @property
    def python(self) -> Path:
        return Path(sys.executable)


_MICROBATCH = (f"{ROOT}[http]",)  # a regular install: the hot path compiled (hatch_build.py)
HTTP_CONTENDERS = [
    HttpContender(
        "microbatch step-wise (HTTP, NDJSON)",
        Contender(
            "microbatch-stream",
            "microbatch",
            "stream_microbatch:stepwise",
            _MICROBATCH,
            "/stream",
            "/health/ready",
            "StepModel, thread stage, max_batch_size 64",
        ),
        "/stream",
        {},
        True,
    ),
    HttpContender(
        "microbatch lockstep (HTTP, NDJSON)",
        Contender(
            "microbatch-stream-lockstep",
            "microbatch",
            "stream_microbatch:lockstep",
            _MICROBATCH,
            "/stream",
            "/health/ready",
            "generator predict, max_batch_size 64",
            venv_name="microbatch-stream",
        ),
        "/stream",
        {},
        False,
    ),
    HttpContender(
        "LitServe continuous-batching loop",
        Contender(
            "litserve-stream",
            "litserve",
            "stream_litserve.py",
            ("litserve==0.2.19",),
            "/predict",
            "/health",
            "ContinuousBatchingLoop, max_batch_size 64",
        ),
        "/predict",
        {"STREAM_LOOP": "continuous"},
        True,
    ),
    HttpContender(
        "LitServe stream=True + batching",
        Contender(
            "litserve-stream-batched",
            "litserve",
            "stream_litserve.py",
            ("litserve==0.2.19",),
            "/predict",
            "/health",
            "stream=True, max_batch_size 64, batch_timeout 10 ms",
            venv_name="litserve-stream",
        ),
        "/predict",
        {"STREAM_LOOP": "batched"},
        False,
    ),
    HttpContender(
        "MOSEC SSE",
        Contender(
            "mosec-stream",
            "mosec",
            "stream_mosec.py",
            ("mosec==0.9.8",),
            "/inference",
            "/",
            "1 worker, max_batch_size 64, max_wait_time 10 ms",
        ),
        "/inference",
        {},
        False,
    ),
    HttpContender(
        "microbatch step-wise (OpenAI chat SSE)",
        Contender(
            "microbatch-stream-openai",
            "microbatch",
            "stream_microbatch:stepwise",
            _MICROBATCH,
            "/v1/chat/completions",
            "/health/ready",
            "StepModel, thread stage, max_batch_size 64; CompletionModel 'steps'",
            venv_name="microbatch-stream",
        ),
        "/v1/chat/completions",
        {},
        True,
        openai=True,
    ),
    HttpContender(
        "LitServe OpenAISpec + batching (OpenAI chat SSE)",
        Contender(
            "litserve-stream-openai",
            "litserve",
            "stream_litserve.py",
            ("litserve==0.2.19",),
            "/v1/chat/completions",
            "/health",
            "OpenAISpec, stream, max_batch_size 64, batch_timeout 10 ms",
            venv_name="litserve-stream",
        ),
        "/v1/chat/completions",
        {"STREAM_LOOP": "openai"},
        False,
        openai=True,
    ),
    HttpContender(
        "Ray Serve @serve.batch generator",
        InThisEnvironment(
            "ray-stream",
            "ray",
            "stream_ray.py",
            (),
            "/predict",
            "/health",
            "@serve.batch over an async generator, max_batch_size 64, batch_wait_timeout"
            " 10 ms, one batch at a time; local Ray, 2 CPUs",
        ),
        "/predict",
        {},
        False,
    ),
]
