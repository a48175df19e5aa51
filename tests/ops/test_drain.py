"""Issue 19, drain delay: on SIGTERM readiness answers 503 at once while requests
are still served for ``--drain-delay-s``; then the graceful shutdown, exit 0."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from microbatch.serve.drain import ShutdownSequence

from .server import HANG_GUARD_S, logged_server


class _App:
    def __init__(self) -> None:
        self.events: list[str] = []

    def stop_being_ready(self) -> None:
        self.events.append("unready")

    def begin_draining(self) -> None:
        self.events.append("draining")


class _Timers:
    """call_later that runs nothing until told."""

    def __init__(self) -> None:
        self.due: list[tuple[float, Callable[[], None]]] = []
        self.cancelled = 0

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timers:
        self.due.append((delay, callback))
        return self

    def cancel(self) -> None:
        self.cancelled += 1


def sequence(delay_s: float) -> tuple[_App, _Timers, list[str], ShutdownSequence]:
    app, timers, stops = _App(), _Timers(), []
    shutdown = ShutdownSequence(app, delay_s, lambda: stops.append("stop"), timers.call_later)
    return app, timers, stops, shutdown


def test_a_signal_turns_readiness_off_and_drains_after_the_delay() -> None:
    app, timers, stops, shutdown = sequence(5.0)
    shutdown.signalled()
    assert app.events == ["unready"] and not stops
    ((delay, fire),) = timers.due
    assert delay == 5.0
    fire()
    assert app.events == ["unready", "draining"] and stops == ["stop"]
    shutdown.signalled()  # after the drain began: nothing more
    assert stops == ["stop"]


def test_a_second_signal_ends_the_delay() -> None:
    app, timers, stops, shutdown = sequence(5.0)
    shutdown.signalled()
    shutdown.signalled()
    assert app.events == ["unready", "draining"] and stops == ["stop"]
    assert timers.cancelled == 1
    timers.due[0][1]()  # a timer that fires anyway changes nothing
    assert stops == ["stop"]


def test_without_a_delay_the_drain_begins_at_once() -> None:
    app, timers, stops, shutdown = sequence(0.0)
    shutdown.signalled()
    assert app.events == ["draining"] and stops == ["stop"] and not timers.due


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="-1"):
        sequence(-1.0)


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "two-http-processes"])
def test_during_the_delay_readiness_is_503_and_predictions_are_still_served(
    tmp_path: Path, workers: str
) -> None:
    with logged_server(
        tmp_path, "tests.http.models:double", "--drain-delay-s", "30", "--workers", workers
    ) as server:
        with httpx.Client(base_url=server.url, timeout=HANG_GUARD_S) as client:
            assert client.get("/health/ready").status_code == 200
            server.process.send_signal(signal.SIGTERM)
            # Readiness answers 503 soon (bounded by the hang guard) ...
            while client.get("/health/ready").status_code == 200:
                pass
            # ... while new connections and requests are still served.
            with httpx.Client(base_url=server.url, timeout=HANG_GUARD_S) as fresh:
                served = fresh.post("/predict", json={"x": 4})
                live = fresh.get("/health/live")
            assert served.status_code == 200 and served.json() == {"y": 8.0}
            assert live.status_code == 200
            assert server.process.poll() is None
        server.process.send_signal(signal.SIGTERM)  # a second signal ends the delay
        assert server.process.wait(HANG_GUARD_S) == 0
