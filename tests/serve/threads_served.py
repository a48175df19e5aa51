"""Services that report the math libraries' threads they run with
(``microbatch serve tests.serve.threads_served:...``): numpy is imported with this
module, before the server or its workers could set anything."""

from __future__ import annotations

import os

import numpy  # noqa: F401  (loaded first, as a model's module loads it)

from microbatch import Model, Service, Stage


class ReportsThreads(Model):
    """Each item's result: this process's OMP_NUM_THREADS and numpy's BLAS threads."""

    def predict(self, batch: list[float]) -> list[dict[str, object]]:
        from threadpoolctl import threadpool_info

        blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
        report = {"omp": os.environ.get("OMP_NUM_THREADS"), "blas": blas[0] if blas else -1}
        return [report for _ in batch]


in_a_worker = Service(Stage(ReportsThreads), name="worker")
"""The model in a worker process."""

in_the_server = Service(Stage(ReportsThreads, mode="thread"), name="server")
"""The model in a thread of the serving process."""
