"""What a worker process sets up before it imports its model: its environment
variables and the CPUs it is pinned to (:class:`WorkerEnv`).

Both must come first. Math libraries read their thread counts once, when they are
loaded (OpenBLAS, MKL and OpenMP, so numpy and torch), and a model's module often
imports them at its top: a variable set after the model's class was unpickled
comes too late. A spawned worker imports the main script of the serving process
before anything else, though: the thread pools of the libraries loaded by then
are resized to the counts set here, with threadpoolctl.

By default a worker's math libraries start as many threads as its share of the
cores, not one per core: the usable cores (its CPU affinity, within a container's
CPU limit) less one (the serving process's, for the HTTP front and the batching),
divided among the stage's workers, at least one; a worker pinned with ``cpus``
gets one per CPU it is pinned to. Each library
would otherwise start one thread per core in every worker, and their threads
spin between calls: with one worker of a small numpy model on 2 cores the serving
process lost its core to them and served 30 to 40 % fewer requests
(``benchmarks/results/http_front.md``, section 16). Where the server's environment
or the stage's ``env`` sets any of the variables, none is set.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CGROUP",
    "THREAD_VARIABLES",
    "WorkerEnv",
    "cpu_quota",
    "default_threads",
    "share_serving_cores",
    "usable_cores",
]

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
"""The thread counts of the math libraries (OpenMP, OpenBLAS, MKL, Accelerate, numexpr)."""

CGROUP = Path("/sys/fs/cgroup")
"""Where a container sees its own cgroup (and a host its root one)."""

# Each variable, and the library (threadpoolctl's internal_api) whose pool it sizes.
_POOLS = (
    ("OMP_NUM_THREADS", "openmp"),
    ("OPENBLAS_NUM_THREADS", "openblas"),
    ("MKL_NUM_THREADS", "mkl"),
)


def default_threads(workers: int, cpus: Sequence[int] | None, usable: int) -> int:
    """A worker's math-library threads: one per CPU it is pinned to, or the
    ``usable`` cores less one shared among the stage's ``workers`` (at least one)."""
    if cpus is not None:
        return max(1, len(cpus))
    return max(1, (usable - 1) // workers)


def usable_cores(cgroup: Path = CGROUP) -> int:
    """The cores this process may run on: its CPU affinity, and no more than its
    container's CPU limit (the cgroup's quota, rounded up), where it has one."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    quota = cpu_quota(cgroup)
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def cpu_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPUs a cgroup may use (its CFS quota over its period), as a container sees
    its own cgroup: ``cpu.max`` (cgroup v2) or ``cpu/cpu.cfs_quota_us`` and
    ``cpu/cpu.cfs_period_us`` (v1) under ``cgroup``; None without a limit or files."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if quota in ("max", "-1") or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return int(quota) / int(period)


@dataclass(frozen=True)
class WorkerEnv:
    """A worker process's environment variables and CPU pinning, applied by
    :meth:`apply` before anything imports its model.

    Attributes:
        variables: Set in the worker's ``os.environ``.
        cpus: The CPU ids it is pinned to (None: not pinned).
    """

    variables: Mapping[str, str]
    cpus: Sequence[int] | None = None

    @classmethod
    def of(
        cls,
        env: Mapping[str, str],
        cpus: Sequence[int] | None,
        workers: int,
        environ: Mapping[str, str] = os.environ,
        usable: int | None = None,
    ) -> WorkerEnv:
        """A worker's: the stage's ``env`` for it, and its CPUs; the math libraries'
        thread counts too unless ``environ`` (the server's) or ``env`` sets one."""
        variables = dict(env)
        if not _sets_threads(environ) and not _sets_threads(env):
            cores = usable if usable is not None else usable_cores()
            threads = str(default_threads(workers, cpus, cores))
            variables.update(dict.fromkeys(THREAD_VARIABLES, threads))
        return cls(variables, None if cpus is None else list(cpus))

    def pool_limits(self) -> dict[str, int]:
        """The thread counts these variables set, by threadpoolctl's library name."""
        limits = {}
        for variable, library in _POOLS:
            value = self.variables.get(variable, "")
            if value.isdigit() and int(value) > 0:
                limits[library] = int(value)
        return limits

    def apply(self) -> None:
        """Set the variables, pin this process (Linux), and resize the thread pools
        of the math libraries loaded already to the counts the variables set."""
        os.environ.update(self.variables)
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)
        limits = self.pool_limits()
        if limits:
            from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

            loaded = ThreadpoolController()
            for library, threads in limits.items():
                loaded.select(internal_api=library).limit(limits=threads)  # it stays so


def share_serving_cores(environ: Mapping[str, str] = os.environ) -> int | None:
    """Resize the BLAS thread pools (OpenBLAS, MKL, BLIS) loaded in this process
    (the serving process: a thread stage's model, a ``@batch`` function) to the
    usable cores less one, the event loop's, at least one; the count set, or None
    where ``environ`` sets a thread variable (then nothing is changed).

    OpenMP's pool (torch's) is left as the model's setup may have set it
    (``torch.set_num_threads``); libraries first loaded later keep their default."""
    if _sets_threads(environ):
        return None
    from threadpoolctl import ThreadpoolController

    threads = max(1, usable_cores() - 1)
    ThreadpoolController().limit(limits=threads, user_api="blas")  # it stays so
    return threads


def _sets_threads(variables: Mapping[str, str]) -> bool:
    """Whether ``variables`` set a math library's thread count (then it is left to them)."""
    return any(name in variables for name in THREAD_VARIABLES)
