"""``microbatch bench``: a load generator for a running server.

:mod:`.parser` frames HTTP/1.1 responses, :mod:`.client` is the keep-alive client,
:mod:`.load` offers closed- and open-loop load, :mod:`.bodies` finds request
bodies, :mod:`.scrape` reads batch sizes from ``/metrics``, :mod:`.runner` runs a
whole session, :mod:`.report` prints and plots it, and the command line
is :mod:`microbatch.cli._bench`.
"""

from .bodies import Bodies, BodyError, bodies_from_service, parse_body, read_body_file, sample
from .client import Connection, ConnectionClosed, Endpoint, RequestTimeout
from .load import closed_loop, open_loop
from .parser import ProtocolError, Response, ResponseParser
from .report import PlotUnavailable, plot, to_json, to_text
from .results import RunResult, Tally, percentile
from .runner import BenchPlan, BenchReport, run_bench
from .scrape import mean_batch_sizes, parse_batch_totals

__all__ = [
    "BenchPlan",
    "BenchReport",
    "Bodies",
    "BodyError",
    "Connection",
    "ConnectionClosed",
    "Endpoint",
    "PlotUnavailable",
    "ProtocolError",
    "RequestTimeout",
    "Response",
    "ResponseParser",
    "RunResult",
    "Tally",
    "bodies_from_service",
    "closed_loop",
    "mean_batch_sizes",
    "open_loop",
    "parse_batch_totals",
    "parse_body",
    "percentile",
    "plot",
    "read_body_file",
    "run_bench",
    "sample",
    "to_json",
    "to_text",
]
