"""The simulated step model of ``benchmarks/streaming.py``, free of any server
framework so that every contender's virtualenv can import it.

Each step sleeps ``1 ms + 10 us x items in the step`` (as an accelerator would); a
chunk is the string ``"@"`` (the client counts them, whatever the framing).
"""

from __future__ import annotations

import time

BASE_STEP_S = 0.001
PER_ITEM_STEP_S = 0.00001
MAX_ACTIVE = 64
CHUNK = "@"


def step_time_s(active: int) -> float:
    """What one step over ``active`` items costs."""
    return BASE_STEP_S + PER_ITEM_STEP_S * active


def simulate_step(active: int) -> None:
    """Spend one step's time."""
    time.sleep(step_time_s(active))
