"""matplotlib for the commands that draw (``bench --plot``, ``tune --plot``): an
optional dependency, loaded on first use with a headless backend."""

from __future__ import annotations

from typing import Any

__all__ = ["PlotUnavailable", "pyplot"]


class PlotUnavailable(Exception):
    """matplotlib is not installed."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed).

    Raises:
        PlotUnavailable: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install matplotlib (or microbatch[examples])"
        ) from exc
    return plt
