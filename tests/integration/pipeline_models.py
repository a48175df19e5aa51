"""Models for the pipeline tests: importable, because workers are spawned."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from microbatch.pipeline import Model, WorkerContext


class AddOne(Model):
    def predict(self, batch: list[int]) -> list[int]:
        return [x + 1 for x in batch]


class Square(Model):
    def predict(self, batch: list[int]) -> list[int]:
        return [x * x for x in batch]


class Picky(Model):
    """Fails multiples of 7 on their own; a multiple of 11 makes the whole batch raise."""

    def predict(self, batch: list[int]) -> list[Any]:
        if any(x % 11 == 0 for x in batch):
            raise ArithmeticError("eleven spoils the batch")
        return [ValueError(f"{x} is a multiple of 7") if x % 7 == 0 else x for x in batch]


class Slow(Model):
    """Sleeps per batch and says which worker ran each item."""

    def __init__(self, seconds: float = 0.002) -> None:
        self.seconds = seconds

    def setup(self, worker: WorkerContext) -> None:
        self.worker = worker

    def predict(self, batch: list[int]) -> list[tuple[int, int, int]]:
        time.sleep(self.seconds)
        return [(x, os.getpid(), len(batch)) for x in batch]


class Identity(Model):
    def predict(self, batch: list[Any]) -> list[Any]:
        return batch


class ExitsInSetup(Model):
    def setup(self, worker: WorkerContext) -> None:
        os._exit(3)


class RaisesInSetup(Model):
    def setup(self, worker: WorkerContext) -> None:
        raise FileNotFoundError("no weights at /nowhere")


class ReadsEnv(Model):
    def setup(self, worker: WorkerContext) -> None:
        self.tag = f"{os.environ.get('MICROBATCH_TEST_TAG')}/{worker.stage}/{worker.index}"

    def predict(self, batch: list[int]) -> list[str]:
        return [self.tag for _ in batch]


class ReportsThreads(Model):
    """Says its OMP_NUM_THREADS and the size of numpy's BLAS thread pool (numpy is
    imported with this module, before the worker's environment could apply)."""

    def predict(self, batch: list[int]) -> list[tuple[str | None, int]]:
        from threadpoolctl import threadpool_info

        blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
        omp = os.environ.get("OMP_NUM_THREADS")
        return [(omp, blas[0] if blas else -1) for _ in batch]


class CountsBatches(Model):
    """Says which process ran each item and how many batches that model had run."""

    def setup(self, worker: WorkerContext) -> None:
        self.batches = 0

    def predict(self, batch: list[Any]) -> list[tuple[Any, int, int]]:
        self.batches += 1
        return [(x, os.getpid(), self.batches) for x in batch]


class FailsWarmUp(Model):
    def predict(self, batch: list[str]) -> list[Any]:
        return [KeyError(x) if x == "bad example" else x for x in batch]


class ReturnsUnpicklable(Model):
    """Odd items come back as a lock, which cannot cross a process boundary."""

    def predict(self, batch: list[int]) -> list[Any]:
        return [threading.Lock() if x % 2 else x for x in batch]


class ReportsCpus(Model):
    def predict(self, batch: list[int]) -> list[list[int]]:
        cpus = sorted(os.sched_getaffinity(0))
        return [cpus for _ in batch]


class SetsUpUnlessMarked(Model):
    """Sets up while the file named by its argument does not exist, then crashes."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def setup(self, worker: WorkerContext) -> None:
        if os.path.exists(self.marker):
            os._exit(7)

    def predict(self, batch: list[int]) -> list[int]:
        return batch


class Flaky(Model):
    """Fails an item when a salted hash says so; sleeps a little per batch."""

    def __init__(self, salt: int, one_in: int) -> None:
        self.salt = salt
        self.one_in = one_in

    def predict(self, batch: list[int]) -> list[Any]:
        time.sleep(0.0005 * len(batch))
        return [
            ValueError(f"unlucky {x}") if hash((self.salt, x)) % self.one_in == 0 else x + 1
            for x in batch
        ]


class Recorder(Model):
    """Remembers every item it computed (run it as a thread stage to read ``seen``)."""

    seen: ClassVar[list[Any]] = []

    def predict(self, batch: list[Any]) -> list[Any]:
        Recorder.seen.extend(batch)
        return batch


class Reverse(Model):
    """Each item reversed (a numpy array as a new array), so results are not the inputs."""

    def predict(self, batch: list[Any]) -> list[Any]:
        return [x[::-1].copy() if isinstance(x, np.ndarray) else x[::-1] for x in batch]


class SlowRecorder(Recorder):
    """:class:`Recorder` that takes ``seconds`` per batch (``seen`` is shared)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def predict(self, batch: list[Any]) -> list[Any]:
        Recorder.seen.extend(batch)
        time.sleep(self.seconds)
        return batch


class SlowSetup(Model):
    """Takes ``seconds`` to set up, then returns its batches."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def setup(self, worker: WorkerContext) -> None:
        time.sleep(self.seconds)

    def predict(self, batch: list[Any]) -> list[Any]:
        return batch


class ReturnsWorkerOnlyClass(Model):
    """Returns each item next to an instance of a class that only the worker can
    import: the serving process cannot unpickle the result."""

    def setup(self, worker: WorkerContext) -> None:
        module = types.ModuleType("microbatch_worker_only")
        exec("class Token:\n    pass", module.__dict__)
        sys.modules[module.__name__] = module
        self.token = module.Token

    def predict(self, batch: list[Any]) -> list[Any]:
        return [(x, self.token()) for x in batch]


class Expand(Model):
    """A small item in, a large result out (like an embedding model): x -> a 64x512
    float32 array filled with x (128 KiB)."""

    def predict(self, batch: list[int]) -> list[Any]:
        import numpy as np

        return [np.full((64, 512), x, dtype=np.float32) for x in batch]


# -- signalling: a model tells the test what it does, and waits for its go --------


class Beacon:
    """A Unix socket through which models in workers tell the test which batch they
    start and wait for its go, so that the test waits for events instead of
    sleeping: ``await beacon.started()`` is the next batch a model holds;
    ``beacon.let_go()`` lets every held batch, and every later one, go.

    Give the model ``beacon.args``. ``async with beacon`` serves the socket; leaving
    it lets everything go, so enter it inside the service's block
    (``async with Service(...) as service, beacon:``): a failing test then cannot
    leave the service's close waiting for a held batch."""

    def __init__(self, directory: Path) -> None:
        self.path = str(directory / "beacon")
        self._started: asyncio.Queue[list[int]] = asyncio.Queue()
        self._go = asyncio.Event()
        self._server: asyncio.Server | None = None

    @property
    def args(self) -> tuple[str]:
        """The arguments of :class:`Signalled`."""
        return (self.path,)

    async def started(self, timeout_s: float = 30.0) -> list[int]:
        """The items of the next batch a model started (bounded by a hang guard)."""
        async with asyncio.timeout(timeout_s):
            return await self._started.get()

    def let_go(self) -> None:
        """Every held batch goes on; later batches do not wait."""
        self._go.set()

    async def __aenter__(self) -> Beacon:
        self._server = await asyncio.start_unix_server(self._hold, self.path)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.let_go()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            self._started.put_nowait([int(item) for item in line.split()])
            await self._go.wait()
            writer.write(b".")
            await writer.drain()
        except ConnectionError:  # its worker was killed
            pass
        finally:
            writer.close()


class Signalled(Model):
    """Says each batch it starts through a :class:`Beacon` and returns it (like
    :class:`Slow`: item, pid, batch size) once the test lets it go. Without the
    beacon (the test has left it) it does not wait."""

    def __init__(self, beacon: str) -> None:
        self.beacon = beacon

    def predict(self, batch: list[int]) -> list[tuple[int, int, int]]:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as connection:
            connection.connect(self.beacon)
            connection.sendall(" ".join(str(x) for x in batch).encode() + b"\n")
            connection.recv(1)  # the go, or the end when the test is gone
        return [(x, os.getpid(), len(batch)) for x in batch]
