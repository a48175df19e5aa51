"""A model that runs out of GPU memory for real, for ``benchmarks/gpu_checks.py``.

Each item is a length (rows of 4096 float32, 16 KiB a row); a batch pads its items
to the longest and holds three tensors of that size on the GPU at once (its input,
``relu``'s and the product), so a batch needs ``3 x items x longest x 16 KiB``.
The process may use only ``limit_gib`` of the GPU
(``torch.cuda.set_per_process_memory_fraction``), so a batch above that raises
PyTorch's own ``torch.cuda.OutOfMemoryError`` from the caching allocator, as a
model on a full card does.
"""

from __future__ import annotations

from typing import Any

from microbatch.pipeline import Model, WorkerContext

WIDTH = 4096
ROW_BYTES = 4 * WIDTH
PEAK_BYTES_PER_COST = 3 * ROW_BYTES
"""GPU bytes at a batch's peak per unit of its padded cost (items x longest)."""


def batch_bytes(lengths: list[int]) -> int:
    """What a batch of these lengths holds on the GPU at its peak."""
    return len(lengths) * max(lengths) * PEAK_BYTES_PER_COST


class CudaActivations(Model):
    """Answers ``2 * length`` for each item, computed on the GPU; an item of length
    0 answers the MiB the process holds on the GPU when it is reached.

    Args:
        limit_gib: The most GPU memory this process may allocate.
    """

    def __init__(self, limit_gib: float) -> None:
        self.limit_gib = limit_gib

    def setup(self, worker: WorkerContext) -> None:
        """Cap this process's share of the GPU."""
        import torch

        self.torch = torch
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(self.limit_gib * 2**30 / total)
        torch.zeros(1, device="cuda")  # the context, before the first batch

    def predict(self, batch: list[int]) -> list[Any]:
        """Pad the batch, compute on it, read each item's value back."""
        torch = self.torch
        if all(length == 0 for length in batch):
            held = torch.cuda.memory_allocated() / 2**20
            return [held] * len(batch)
        longest = max(max(batch), 1)
        lengths = torch.tensor(batch, dtype=torch.float32, device="cuda")
        inputs = lengths.view(-1, 1, 1).expand(len(batch), longest, WIDTH).contiguous()
        outputs = torch.relu(inputs) * 2
        return [float(value) for value in outputs[:, 0, 0].tolist()]
