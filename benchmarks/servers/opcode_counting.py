"""``microbatch`` with a count of the Python opcodes each function runs: counting
starts at SIGUSR1; SIGUSR2 stops it and writes the counts, as JSON
(``{"module.py:qualified.name": opcodes}``: keys that do not move with
the code's lines, so that two trees compare), to the file ``OPCODE_COUNTS_FILE``
names. Only the serving thread is counted (the event loop's: where the front's
work per request runs).

Run, from ``benchmarks/servers``: ``python opcode_counting.py serve MODULE:ATTR
--port 0`` (the arguments of ``microbatch``). Used by ``benchmarks/hot_path_opcodes.py``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from types import CodeType, FrameType
from typing import Any

_counts: Counter[CodeType] = Counter()


def _trace(frame: FrameType, event: str, arg: Any) -> Any:
    """Each new frame: count its opcodes under its code object."""
    frame.f_trace_opcodes = True
    code = frame.f_code

    def count(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            _counts[code] += 1
        return count

    return count


def _name(code: CodeType) -> str:
    path = code.co_filename
    for marker in ("site-packages/", "src/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{code.co_qualname}"


def _start(signum: int, frame: FrameType | None) -> None:
    _counts.clear()
    sys.settrace(_trace)


def _stop(signum: int, frame: FrameType | None) -> None:
    sys.settrace(None)
    counts: Counter[str] = Counter()
    for code, opcodes in _counts.items():
        counts[_name(code)] += opcodes
    with open(os.environ["OPCODE_COUNTS_FILE"], "w") as sink:
        json.dump(dict(counts), sink)


if __name__ == "__main__":  # the model's worker processes import this module too
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
    from microbatch.cli import main

    sys.exit(main(sys.argv[1:]))
