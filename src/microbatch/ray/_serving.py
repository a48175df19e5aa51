"""Deploy an application on a Ray cluster, serve until SIGTERM or Ctrl-C, then take it
down (what ``microbatch serve MODULE:ATTR --ray`` runs).

Without ``--ray-address`` a Ray instance is started for this process alone and
stopped with it; with one (``auto`` for the cluster that ``ray start`` began on this
machine, or ``HOST:PORT`` of a head node) the service is deployed there and deleted
again on exit, leaving the cluster running.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType

import ray
from ray import serve

__all__ = ["ClusterUnreachable", "RayServeSettings", "serve_on_ray"]

logger = logging.getLogger("microbatch.ray")

_PROBE_TIMEOUT_S = 5.0


class ClusterUnreachable(ConnectionError):
    """Nothing answers at the given Ray address."""


@dataclass(frozen=True)
class RayServeSettings:
    """Where and how ``microbatch serve --ray`` deploys.

    Args:
        address: A Ray cluster to join (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``);
            ``None`` starts a local Ray instance for this process.
        host: Address Ray's HTTP proxies bind.
        port: Port of Ray's HTTP proxies; 0 picks one that is free on this machine.
        app_name: The Ray Serve application's name.
        log_level: ``debug``, ``info``, ``warning`` or ``error``, for Ray Serve's logs too.
    """

    address: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    app_name: str = "microbatch"
    log_level: str = "info"


def serve_on_ray(application: object, settings: RayServeSettings) -> int:
    """Deploy ``application``, print the URL, serve until SIGTERM/SIGINT; return 0.

    Raises:
        ClusterUnreachable: Nothing answers at ``settings.address``.
        ConnectionError: Ray found no cluster (``address="auto"``).
        RuntimeError: The application failed to deploy.
    """
    port = settings.port or _free_port(settings.host)
    logs = {"log_level": settings.log_level.upper()}
    with _connected(settings.address, settings.log_level):
        serve.start(http_options={"host": settings.host, "port": port}, logging_config=logs)
        try:
            serve.run(application, name=settings.app_name, route_prefix="/", logging_config=logs)
            stop = _stop_on_signals()  # after ray.init, whose own SIGTERM handler exits
            host = f"[{settings.host}]" if ":" in settings.host else settings.host
            print(f"microbatch serving on http://{host}:{port}", flush=True)
            stop.wait()
            logger.info("stopping: deleting the application %r", settings.app_name)
        finally:
            _take_down(settings)
    return 0


@contextlib.contextmanager
def _connected(address: str | None, log_level: str) -> Iterator[None]:
    """Join the cluster at ``address`` (or start a local one); leave it on exit."""
    level = logging.getLevelName(log_level.upper())
    if address is None:
        ray.init(address="local", include_dashboard=False, logging_level=level)
    else:
        _probe(address)
        try:
            ray.init(address=address, logging_level=level)
        except ConnectionError as error:
            raise ClusterUnreachable(
                f"cannot reach the Ray cluster at {address}: {error}"
            ) from error
    try:
        yield
    finally:
        ray.shutdown()


def _take_down(settings: RayServeSettings) -> None:
    """Delete the application (its replicas drain); stop Serve if the cluster is ours."""
    try:
        serve.delete(settings.app_name)
        if settings.address is None:
            serve.shutdown()
    except Exception:
        logger.exception("could not take the application %r down", settings.app_name)


def _probe(address: str) -> None:
    """Fail in seconds, not minutes, when nothing listens at ``HOST:PORT``: Ray's own
    connection attempt retries for a long time before it gives up."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterUnreachable(
            f"expected a Ray address as HOST:PORT, ray://HOST:PORT or auto, got {address!r}"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), _PROBE_TIMEOUT_S):
            pass
    except OSError as error:
        raise ClusterUnreachable(
            f"cannot reach the Ray cluster at {address}: {error}"
            " (is `ray start --head` running there, and is the port open?)"
        ) from error


def _stop_on_signals() -> threading.Event:
    """An event set by the first SIGTERM or SIGINT (the main thread waits on it)."""
    stop = threading.Event()

    def on_signal(number: int, frame: FrameType | None) -> None:
        stop.set()

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, on_signal)
    return stop


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
