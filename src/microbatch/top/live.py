"""The loop of ``microbatch top``: scrape, draw in place, wait for the next refresh
or a key; ``q`` or Ctrl-C ends it with the terminal as it was."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import IO

from rich.console import Console
from rich.live import Live

from .screen import render, render_unreachable
from .snapshot import Snapshot, parse_metrics
from .view import view_between

__all__ = ["Keys", "describe_failure", "fetch_metrics", "metrics_url", "run_top"]


def metrics_url(url: str) -> str:
    """``URL/metrics`` for a bare server URL; a URL with a path is kept."""
    if "://" not in url:
        url = "http://" + url
    scheme, _, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return url if slash and path else f"{scheme}://{host}/metrics"


def fetch_metrics(url: str, token: str | None, timeout_s: float) -> str:
    """The text of ``url`` (``/metrics``).

    Raises:
        OSError: It cannot be reached, or answers other than 200
            (``urllib.error.URLError``, ``HTTPError``).
    """
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        body: bytes = response.read()
    return body.decode("utf-8", errors="replace")


def describe_failure(error: Exception) -> str:
    """A one-line reason a scrape failed, with a hint where there is one."""
    if isinstance(error, urllib.error.HTTPError):
        if error.code == 401:
            return "401: the server wants a token (--auth-token or MICROBATCH_AUTH_TOKEN)"
        return f"it answered {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        reason = error.reason
        text = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
        return f"{text}".lower()
    if isinstance(error, TimeoutError):
        return "no answer in time"
    if isinstance(error, ValueError):
        return f"not Prometheus metrics: {error}"
    return str(error) or type(error).__name__


class Keys:
    """The keyboard, read one key at a time (cbreak: Ctrl-C still interrupts), or
    nothing when input is not a terminal."""

    def __init__(self, stream: IO[str]) -> None:
        self._fd: int | None = None
        with contextlib.suppress(AttributeError, OSError, ValueError):
            if stream.isatty():
                self._fd = stream.fileno()

    @contextlib.contextmanager
    def reading(self) -> Iterator[Keys]:
        """Put the terminal in cbreak mode for the block; restore it after."""
        if self._fd is None:
            yield self
            return
        saved = termios.tcgetattr(self._fd)
        try:
            tty.setcbreak(self._fd)
            yield self
        finally:
            termios.tcsetattr(self._fd, termios.TCSADRAIN, saved)

    def quit_within(self, timeout_s: float, now: Callable[[], float] = time.monotonic) -> bool:
        """Wait up to ``timeout_s`` for ``q``; whether it came."""
        until = now() + timeout_s
        while (left := until - now()) > 0:
            watched = [] if self._fd is None else [self._fd]
            readable, _, _ = select.select(watched, [], [], left)
            if not readable:
                return False
            assert self._fd is not None
            typed = os.read(self._fd, 64)
            if not typed:  # end of input: nothing more will come from it
                self._fd = None
            elif b"q" in typed.lower():
                return True
        return False


def run_top(
    url: str,
    interval_s: float = 1.0,
    token: str | None = None,
    console: Console | None = None,
    keys: Keys | None = None,
    now: Callable[[], float] = time.monotonic,
) -> int:
    """Show the server at ``url`` until ``q`` or Ctrl-C; the exit status (0)."""
    target = metrics_url(url)
    console = console or Console()
    keys = keys or Keys(sys.stdin)
    previous: Snapshot | None = None
    try:
        with (
            keys.reading(),
            Live(console=console, screen=True, auto_refresh=False, transient=False) as live,
        ):
            while True:
                try:
                    current = parse_metrics(fetch_metrics(target, token, interval_s + 2), now())
                except (OSError, ValueError) as error:
                    live.update(render_unreachable(target, describe_failure(error), interval_s))
                    previous = None
                else:
                    live.update(render(target, view_between(previous, current), interval_s))
                    previous = current
                live.refresh()
                if keys.quit_within(interval_s, now):
                    return 0
    except KeyboardInterrupt:
        return 0
