"""One local Ray instance for the tests that need one, started once for them all and
stopped here.

It binds Ray Serve's proxy to a free port of 127.0.0.1; at the end it stops Serve and
Ray and checks that every process they started is gone.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from .processes import descendants, wait_gone

if importlib.util.find_spec("ray") is None:  # the `ray` extra is not installed
    collect_ignore_glob = ["test_*.py"]

EXIT_GUARD_S = 60.0
START_ATTEMPTS = 2


@dataclass(frozen=True)
class Cluster:
    """The running local Ray instance: the URL of Serve's HTTP proxy."""

    url: str


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    """Ray with 2 CPUs and Serve on a free port, shared by this package's tests (each
    deploys applications of its own names); all of it stopped after the last."""
    import ray
    from ray import serve

    from .models import NAMESPACE

    before = descendants(os.getpid())
    for attempt in range(START_ATTEMPTS):
        try:
            ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
            break
        except RuntimeError as error:
            # Ray's own start-up: its GCS server did not report its port within
            # Ray's 30 s (seen once on this 2-core machine, leaving no log). What
            # it started is stopped before the next try, and checked gone below.
            if attempt + 1 == START_ATTEMPTS or "Timed out" not in str(error):
                raise
            ray.shutdown()
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield Cluster(f"http://127.0.0.1:{port}")
    finally:
        started = descendants(os.getpid()) - before
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
        left = wait_gone(started, EXIT_GUARD_S)
        assert not left, f"Ray left processes behind: {sorted(left)}"
