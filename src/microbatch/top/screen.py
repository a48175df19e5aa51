"""How ``microbatch top`` draws a :class:`~.view.View` (with rich)."""

from __future__ import annotations

import math

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .view import View

__all__ = ["render", "render_unreachable"]

_BAR = "█"


def render(url: str, view: View, interval_s: float) -> RenderableType:
    """The whole screen for one refresh."""
    return Group(
        _header(url, view.ready, interval_s),
        _requests(view),
        _stages(view),
        _batch_sizes(view),
    )


def render_unreachable(url: str, reason: str, interval_s: float) -> RenderableType:
    """The screen while the server cannot be read: what failed and what to do."""
    message = Text()
    message.append(f"cannot read {url}\n", style="bold red")
    message.append(f"{reason}\n\n")
    message.append(f"Is `microbatch serve` running there? Trying again every {interval_s:g} s.")
    return Group(
        _header(url, None, interval_s),
        Panel(message, title="server unreachable", border_style="red"),
    )


def _header(url: str, ready: bool | None, interval_s: float) -> Text:
    text = Text()
    text.append("microbatch top ", style="bold")
    text.append(url)
    if ready is not None:
        text.append("  ")
        text.append("READY" if ready else "NOT READY", style="green" if ready else "bold red")
    text.append(f"  every {interval_s:g} s  (q: quit)", style="dim")
    return text


def _requests(view: View) -> Table:
    table = Table(title="requests", title_justify="left", expand=False)
    for column in ("/predict req/s", "p50", "p99", "items in service", "all routes by status/s"):
        table.add_column(column, justify="right")
    statuses = "  ".join(
        f"{status}: {_number(rate)}" for status, rate in view.statuses_per_s.items()
    )
    table.add_row(
        _number(view.requests_per_s),
        _duration(view.p50_s),
        _duration(view.p99_s),
        _number(view.items_in_service),
        statuses or "-",
    )
    return table


def _stages(view: View) -> Table:
    table = Table(title="stages", title_justify="left")
    columns = (
        "stage",
        "batches/s",
        "mean batch",
        "queued",
        "in batches",
        "workers alive",
        "restarts",
        "deadline misses/s",
    )
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    for name, stage in view.stages.items():
        restarts = _number(stage.restarts)
        if stage.new_restarts:
            restarts += f" (+{_number(stage.new_restarts)})"
        table.add_row(
            name,
            _number(stage.batches_per_s),
            _number(stage.mean_batch_size, 1),
            _number(stage.queue_depth),
            _number(stage.in_flight_items),
            Text(_number(stage.workers_alive), style="bold red" if not stage.workers_alive else ""),
            Text(restarts, style="yellow" if stage.new_restarts else ""),
            _number(stage.deadline_misses_per_s),
        )
    return table


def _batch_sizes(view: View) -> Table:
    table = Table(title="batch sizes", title_justify="left")
    table.add_column("stage")
    bounds = sorted(
        {bound for stage in view.stages.values() for bound, share in stage.batch_sizes if share > 0}
    )
    for bound in bounds:
        table.add_column("more" if math.isinf(bound) else f"<={bound:g}", justify="left")
    for name, stage in view.stages.items():
        shares = dict(stage.batch_sizes)
        table.add_row(name, *(_share(shares.get(bound, 0.0)) for bound in bounds))
    return table


def _share(share: float) -> str:
    return f"{share:4.0%} {_BAR * round(share * 8)}"


def _number(value: float, digits: int = 0) -> str:
    if math.isnan(value):
        return "-"
    if digits == 0 and (value >= 100 or float(value).is_integer()):
        return f"{value:,.0f}"
    return f"{value:,.{max(digits, 1)}f}"


def _duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"
