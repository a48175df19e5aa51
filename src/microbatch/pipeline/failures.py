"""A stage that cannot set up: the error its caller sees, with the traceback into
the user's code."""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import RemoteError, StageFailed

__all__ = ["died_early", "exit_description", "setup_failure", "user_frames", "warm_up_error"]

_PACKAGE = str(Path(__file__).resolve().parents[1])  # src/microbatch
_FRAME = re.compile(r'^  File "(?P<path>[^"]+)"')


def setup_failure(where: str, attempts: int, errors: Sequence[BaseException]) -> StageFailed:
    """The StageFailed of ``where`` (a stage's worker) that failed ``attempts`` times
    in setup; its message ends with the traceback of the last error, less our frames."""
    last = errors[-1] if errors else None
    message = f"{where} died {attempts} times in setup"
    if last is not None:
        message += f": {last}"
    text = last.traceback_text if isinstance(last, RemoteError) else ""
    if text:
        message += "\n" + user_frames(text)
    return StageFailed(message)


def user_frames(traceback_text: str) -> str:
    """``traceback_text`` without the frames of microbatch's own code (the worker's
    main loop, the pool): what is left points into the user's code."""
    kept: list[str] = []
    skipping = False
    for line in traceback_text.rstrip("\n").splitlines():
        frame = _FRAME.match(line)
        if frame is not None:
            skipping = frame["path"].startswith(_PACKAGE)
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def warm_up_error(items: Sequence[Any], outcomes: Sequence[Any]) -> RemoteError | None:
    """The error of the first warm-up item that failed, naming the item; None if
    every item went through."""
    for item, outcome in zip(items, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            error = (
                outcome
                if isinstance(outcome, RemoteError)
                else RemoteError(type(outcome).__qualname__, str(outcome), "")
            )
            return RemoteError(
                error.type_name,
                f"warm-up item {item!r:.80} failed: {error.message}",
                error.traceback_text,
            )
    return None


def died_early(code: int | None) -> str:
    """Why a worker died before its model was set up, with a hint for the usual cause."""
    hint = ""
    if code == 1:
        hint = (
            " - if it printed a RuntimeError about bootstrapping, the main script starts"
            " the service when imported: workers are spawned and import the main module,"
            " so guard it with `if __name__ == '__main__':`"
        )
    return f"worker died before its model was set up (exit code {code}){hint}"


def exit_description(code: int | None) -> str:
    """How a process ended, for a log line: ``exit code 1``, ``killed by signal
    SIGKILL (9)`` (a negative exit code), or ``exit code unknown``."""
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "an unknown signal"
        return f"killed by signal {name} ({-code})"
    return f"exit code {code}"
