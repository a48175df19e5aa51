"""``microbatch serve --workers N``: N HTTP processes in front of one Service.

One process speaks HTTP on one core at most; past a few thousand requests a second
its event loop, not the model, is the limit. With ``--workers N`` the process you
start becomes the hub: it binds the socket, starts the Service (its batchers and
model workers), then starts N front processes. Each front accepts connections on
the shared socket, parses, validates and encodes HTTP, and relays the decoded items
to the hub, which batches the items of every front together (see :mod:`.hub`). The
model is loaded once, in the Service's workers, however many fronts there are.

A front that dies is started again; the items it had relayed are cancelled (their
connections died with it). SIGTERM or SIGINT: every front turns readiness to 503,
stops accepting and finishes the requests it has; then the Service drains and the
hub exits 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import uvloop

from ..http.app import HttpApp, HttpConfig
from ..loading import as_servable, load_target
from ..logs import configure as configure_logs
from ..pipeline.failures import exit_description
from ..streams import MAX_BUFFERED_CHUNKS
from ..types import Servable, StreamingServable
from .front import RelayTarget
from .hub import Hub
from .server import ServeSettings, bind, listen_url, ready_to_serve, serve
from .switch_interval import switch_interval

if TYPE_CHECKING:
    from ..tracing import Tracer

__all__ = ["run_front", "serve_workers"]

logger = logging.getLogger("microbatch.http")

_SPAWN = multiprocessing.get_context("spawn")
_LISTEN_BACKLOG = 2048
_STEADY_S = 10.0  # a front that lived this long starts again without a pause
_MAX_PAUSE_S = 30.0


def serve_workers(
    spec: str, served: object, config: HttpConfig, settings: ServeSettings, workers: int
) -> int:
    """Serve ``served`` (loaded from ``spec``) with ``workers`` front processes until
    SIGTERM or SIGINT; return the exit status (0 after a drain, 1 if it cannot start).

    Raises:
        OSError: The address cannot be bound.
    """
    sock = bind(settings.host, settings.port)
    sock.listen(_LISTEN_BACKLOG)
    with sock, switch_interval(settings.switch_interval_s):  # the hub steps the stages
        hub = _HubProcess(spec, as_servable(served), config, settings, workers, sock)
        return uvloop.run(hub.run())


def run_front(
    spec: str,
    config: HttpConfig,
    settings: ServeSettings,
    listener: socket.socket,
    relay: socket.socket,
) -> None:
    """A front process: serve HTTP on ``listener``, relaying items to the hub on
    ``relay``. The module is imported here too, for the served model's types."""
    configure_logs(settings.log_level, settings.log_format)
    local = as_servable(load_target(spec))
    target = RelayTarget(
        local.name,
        local.input_type,
        local.output_type,
        relay,
        routes=local.routes,
        on_hub_lost=_terminate_self,
        examples=local.examples,
        streaming=_streaming_routes(local),
        embedding_model=getattr(local, "embedding_model", None),
        completion_model=getattr(local, "completion_model", None),
        max_buffered_chunks=_stream_bound(local),
    )
    app = HttpApp(target, config)
    target.requests = app.metrics.requests
    no_steps = dataclasses.replace(settings, switch_interval_s=None)  # no step thread here
    serve(app, no_steps, sock=listener, announce=False)


def _stream_bound(local: Servable[Any, Any]) -> int:
    """The most chunks a stream may hold unread at the front: the largest bound of the
    served stages (``Stage(max_buffered_chunks=...)``; None: no limit), so that the
    front cuts no stream sooner than its stage would."""
    stages = getattr(local, "stages", None)
    if not stages:  # not a Service
        return MAX_BUFFERED_CHUNKS
    bounds = [stage.max_buffered_chunks for stage in stages]
    return sys.maxsize if None in bounds else max(bounds)


def _streaming_routes(local: Servable[Any, Any]) -> list[str | None]:
    """The routes of ``local`` whose results stream (None: the whole model)."""
    if not isinstance(local, StreamingServable):
        return []
    return [route for route in (None, *local.routes) if local.can_stream(route)]


def _terminate_self() -> None:
    """The hub is gone: drain (every waiting request has its 503) and exit."""
    os.kill(os.getpid(), signal.SIGTERM)


class _HubProcess:
    """The process ``microbatch serve --workers N`` started: the Service and the fronts."""

    def __init__(
        self,
        spec: str,
        target: Servable[Any, Any],
        config: HttpConfig,
        settings: ServeSettings,
        count: int,
        listener: socket.socket,
    ) -> None:
        self.spec = spec
        self.target = target
        self.config = config
        self.settings = settings
        self.count = count
        self.listener = listener
        self.hub = Hub(target, _tracer(config))
        self._processes: dict[int, BaseProcess] = {}
        self._exits: dict[int, asyncio.Future[None]] = {}
        self._pauses = [0.0] * count
        self._stopping = False

    async def run(self) -> int:
        """Start, serve until a signal, drain; the exit status."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        starting = asyncio.current_task()

        def on_signal() -> None:
            if stop.is_set():
                self._signal_fronts()  # a second signal ends their drain delay
            stop.set()
            if starting is not None and not self.hub.serving:
                starting.cancel()  # a signal while starting: give up the start

        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, on_signal)
        try:
            status = await self._start_all()
        except asyncio.CancelledError:
            status = 0
        if status is not None:
            await self._stop_fronts()
            await self.target.close()
            return status
        self.hub.serving = True
        ready_to_serve()
        print(f"microbatch serving on {listen_url(self.settings.host, self.listener)}", flush=True)
        await stop.wait()
        self.hub.draining = True
        await self._stop_fronts()
        self.hub.close()
        await self.target.close()
        return 0

    async def _start_all(self) -> int | None:
        """Start the service, then every front; an exit status if that failed."""
        try:
            await self.target.start()
        except Exception:
            logger.exception("the service failed to start")
            return 1
        try:
            await asyncio.gather(*(self._start(index) for index in range(self.count)))
        except Exception as error:
            logger.error("an HTTP process failed to start: %s", error)
            return 1
        return None

    async def _start(self, index: int) -> None:
        """Start front ``index``; return once it is connected."""
        ours, theirs = socket.socketpair()
        process = _SPAWN.Process(
            target=run_front,
            args=(self.spec, self.config, self.settings, self.listener, theirs),
            name=f"microbatch-http-{index}",
            daemon=True,
        )
        process.start()
        theirs.close()
        logger.info("HTTP process %d started (pid %s)", index, process.pid)
        loop = asyncio.get_running_loop()
        self._processes[index] = process
        self._exits[index] = exited = loop.create_future()
        started = time.monotonic()
        loop.add_reader(process.sentinel, self._on_exit, index, process, started, exited)
        hello = await self.hub.connect(index, ours)
        await hello

    def _on_exit(
        self, index: int, process: BaseProcess, started: float, exited: asyncio.Future[None]
    ) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(process.sentinel)
        process.join()
        if not exited.done():
            exited.set_result(None)
        if self._stopping:
            return
        lived = time.monotonic() - started
        pause = 0.0 if lived >= _STEADY_S else min(_MAX_PAUSE_S, max(0.5, 2 * self._pauses[index]))
        self._pauses[index] = pause
        logger.error(
            "HTTP process %d (pid %s) exited, %s; starting it again in %.1f s",
            index,
            process.pid,
            exit_description(process.exitcode),
            pause,
        )
        loop.call_later(pause, self._restart, index)

    def _restart(self, index: int) -> None:
        if self._stopping:
            return

        async def start() -> None:
            try:
                await self._start(index)
            except Exception as error:  # it died again while starting: _on_exit retries
                logger.error("HTTP process %d failed to start: %s", index, error)

        asyncio.get_running_loop().create_task(start())

    def _signal_fronts(self) -> None:
        for process in self._processes.values():
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)

    async def _stop_fronts(self) -> None:
        """Each front drains (SIGTERM: it finishes its requests); then, past the grace
        period, it is killed."""
        self._stopping = True
        self._signal_fronts()
        waiting = [exit for exit in self._exits.values() if not exit.done()]
        if not waiting:
            return
        grace_s = self.settings.drain_delay_s + self.settings.graceful_timeout_s
        _, late = await asyncio.wait(waiting, timeout=grace_s + 5)
        for process in self._processes.values():
            if process.is_alive():
                process.kill()
        if late:
            await asyncio.wait(late, timeout=5)


def _tracer(config: HttpConfig) -> Tracer | None:
    """The hub's tracer under ``--otel`` (the fronts make their own), else None."""
    if not config.tracing:
        return None
    from ..tracing import configure  # imports OpenTelemetry: only here

    return configure()
