"""A stage that cannot set up: the error its caller sees, with the traceback into
the user's code."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ..errors import RemoteError, StageFailed

__all__ = ["setup_failure", "user_frames"]

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
