"""A one-line progress bar for the runs, redrawn on a terminal and silent elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TextIO

from .results import Tally

__all__ = ["Progress"]

REDRAW_S = 0.25
_WIDTH = 24


class Progress:
    """Draws ``label [#####-----] 4.1/10.0 s  1,234 req  302 req/s  2 err`` in place.

    Args:
        stream: Where to draw (stderr, so stdout stays clean for ``--json``).
        enabled: Draw at all (the command passes ``stream.isatty()``).
    """

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled

    @contextlib.asynccontextmanager
    async def showing(self, label: str, duration_s: float, tally: Tally) -> AsyncIterator[None]:
        """Redraw the bar for ``tally`` until the block ends, then clear the line."""
        if not self.enabled:
            yield
            return
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def redraw() -> None:
            while True:
                self._draw(label, loop.time() - start, duration_s, tally)
                await asyncio.sleep(REDRAW_S)

        task = loop.create_task(redraw())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.stream.write("\r\x1b[2K")
            self.stream.flush()

    def _draw(self, label: str, elapsed_s: float, duration_s: float, tally: Tally) -> None:
        shown = min(elapsed_s, duration_s)
        filled = int(_WIDTH * shown / duration_s) if duration_s > 0 else _WIDTH
        bar = "#" * filled + "-" * (_WIDTH - filled)
        rate = tally.requests / elapsed_s if elapsed_s > 0 else 0.0
        self.stream.write(
            f"\r\x1b[2K{label} [{bar}] {shown:5.1f}/{duration_s:.1f} s  "
            f"{tally.requests:,} req  {rate:,.0f} req/s  {tally.errors:,} err"
        )
        self.stream.flush()
