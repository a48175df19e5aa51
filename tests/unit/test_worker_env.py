"""A worker process's environment: the stage's variables, and by default its share
of the cores for the math libraries' threads (pipeline/worker_env.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from microbatch.pipeline.worker_env import (
    THREAD_VARIABLES,
    WorkerEnv,
    cpu_quota,
    default_threads,
    usable_cores,
)


def test_a_worker_gets_the_cores_less_the_servers_shared_among_the_workers() -> None:
    assert default_threads(1, None, usable=2) == 1
    assert default_threads(1, None, usable=16) == 15
    assert default_threads(4, None, usable=16) == 3
    assert default_threads(8, None, usable=4) == 1  # at least one
    assert default_threads(4, [2, 3], usable=16) == 2  # one per CPU it is pinned to


def test_every_thread_variable_is_set_beside_the_stages_own() -> None:
    env = WorkerEnv.of({"TAG": "blue"}, None, workers=2, environ={}, usable=9)
    assert env.variables == {"TAG": "blue", **dict.fromkeys(THREAD_VARIABLES, "4")}
    assert env.pool_limits() == {"openmp": 4, "openblas": 4, "mkl": 4}
    pinned = WorkerEnv.of({}, (5,), workers=1, environ={}, usable=9)
    assert pinned.cpus == [5] and pinned.variables["OMP_NUM_THREADS"] == "1"


def test_a_thread_count_set_by_the_server_or_the_stage_leaves_them_all_alone() -> None:
    served = WorkerEnv.of({"TAG": "x"}, None, 1, environ={"MKL_NUM_THREADS": "8"}, usable=9)
    assert served.variables == {"TAG": "x"} and served.pool_limits() == {}
    staged = WorkerEnv.of({"OMP_NUM_THREADS": "6"}, None, 1, environ={}, usable=9)
    assert staged.variables == {"OMP_NUM_THREADS": "6"}
    assert staged.pool_limits() == {"openmp": 6}
    assert WorkerEnv({"OMP_NUM_THREADS": "auto"}).pool_limits() == {}


def test_apply_resizes_the_pool_of_a_library_loaded_before_it() -> None:
    script = (
        "import numpy\n"  # loaded first, as a main script that imports it would
        "from threadpoolctl import threadpool_info\n"
        "from microbatch.pipeline.worker_env import WorkerEnv\n"
        "WorkerEnv({'OPENBLAS_NUM_THREADS': '1'}).apply()\n"
        "print([p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas'])\n"
    )
    env = {"OPENBLAS_NUM_THREADS": "2", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1]"


def test_the_serving_process_leaves_its_event_loop_a_core_unless_told_otherwise() -> None:
    script = (
        "import numpy\n"
        "from threadpoolctl import threadpool_info\n"
        "from microbatch.pipeline.worker_env import share_serving_cores, usable_cores\n"
        "threads = share_serving_cores()\n"
        "pools = [p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas']\n"
        "print(threads == max(1, usable_cores() - 1), pools == [threads])\n"
        "print(share_serving_cores({'OMP_NUM_THREADS': '3'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "None"]


def test_a_containers_cpu_limit_caps_the_usable_cores(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    assert cpu_quota(tmp_path) is None  # no cgroup files: no limit
    (tmp_path / "cpu.max").write_text("max 100000\n")  # cgroup v2, unlimited
    assert cpu_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs
    assert cpu_quota(tmp_path) == 1.5
    assert usable_cores(tmp_path) == min(2, affinity or 2)  # rounded up, within affinity
    (tmp_path / "cpu.max").write_text("garbage")
    assert cpu_quota(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    v1 = tmp_path / "cpu"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(tmp_path) is None
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")  # half a CPU: still one core
    assert cpu_quota(tmp_path) == 0.5 and usable_cores(tmp_path) == 1


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="affinity is Linux's")
def test_without_a_limit_the_usable_cores_are_the_affinity(tmp_path: Path) -> None:
    assert usable_cores(tmp_path) == len(os.sched_getaffinity(0))
