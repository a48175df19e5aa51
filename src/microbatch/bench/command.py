"""The ``microbatch bench URL`` command: load a running server, print what it did."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from .bodies import Bodies, BodyError, bodies_from_service, parse_body, read_body_file
from .client import ConnectionClosed, Endpoint, RequestTimeout
from .parser import ProtocolError
from .progress import Progress
from .report import PlotUnavailable, plot, to_json, to_text
from .runner import BenchPlan, BenchReport, run_bench

__all__ = ["add_parser", "run"]

TOKEN_ENV = "MICROBATCH_AUTH_TOKEN"
T = TypeVar("T")


def add_parser(commands: Any) -> None:
    """Add the ``bench`` sub-command to an argparse sub-parsers object."""
    bench = commands.add_parser(
        "bench",
        help="load a running server: closed loop at concurrency levels, open loop at rates",
        description="Send requests to URL (POST; a bare http://HOST:PORT means /predict) in a "
        "closed loop at each concurrency level and/or an open loop of Poisson arrivals at "
        "each rate, and report req/s, latency percentiles, errors by status and the "
        "server's mean batch size (from /metrics).",
    )
    bench.add_argument("url", metavar="URL", help="e.g. http://127.0.0.1:8000")
    bench.add_argument(
        "-c",
        "--concurrency",
        type=_ints,
        default=None,
        help="closed-loop connection counts, e.g. 1,16,64 (default: 1,16,64 unless --rate)",
    )
    bench.add_argument(
        "--rate", type=_floats, default=(), help="open-loop rates in requests/s, e.g. 500"
    )
    bench.add_argument(
        "-d", "--duration", type=float, default=10.0, help="seconds per run (default 10)"
    )
    bench.add_argument(
        "--warmup", type=float, default=1.0, help="unmeasured seconds before each (default 1)"
    )
    source = bench.add_mutually_exclusive_group()
    source.add_argument("--body-file", help="request bodies, one JSON value per line")
    source.add_argument("--body", help="one JSON request body")
    bench.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        help=f"extra request header 'Name: value' (repeatable); ${TOKEN_ENV} adds a bearer token",
    )
    bench.add_argument(
        "--timeout", type=float, default=30.0, help="seconds before a request counts as timeout"
    )
    bench.add_argument(
        "--max-outstanding",
        type=int,
        default=1024,
        help="open loop: most requests awaiting replies at once (default 1024)",
    )
    bench.add_argument("--seed", type=int, default=0, help="seed of the open loop's arrivals")
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench.add_argument("--plot", metavar="PNG", help="draw latency and throughput to this file")
    bench.add_argument(
        "--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)"
    )


def run(args: argparse.Namespace) -> int:
    """Run ``bench`` with parsed arguments; return the exit status (1: could not run)."""
    try:
        headers = [_header(text) for text in args.header]
        token = os.environ.get(TOKEN_ENV)
        if token and not any(name.lower() == "authorization" for name, _ in headers):
            headers.append(("Authorization", f"Bearer {token}"))
        endpoint = Endpoint.from_url(args.url, headers)
        concurrency = args.concurrency
        if concurrency is None:
            concurrency = () if args.rate else (1, 16, 64)
        plan = BenchPlan(
            endpoint,
            concurrency=concurrency,
            rates=args.rate,
            duration_s=args.duration,
            warmup_s=args.warmup,
            timeout_s=args.timeout,
            max_outstanding=args.max_outstanding,
            seed=args.seed,
        )
    except ValueError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    progress = Progress(sys.stderr, enabled=sys.stderr.isatty() and not args.no_progress)
    try:
        report = run_in_event_loop(_bench(plan, args, progress))
    except (BodyError, OSError, ConnectionClosed, RequestTimeout, ProtocolError) as error:
        print(f"bench: {_reason(error, endpoint)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(to_json(report), indent=2))
    else:
        print(to_text(report))
    if args.plot:
        try:
            plot(report, args.plot)
        except PlotUnavailable as error:
            print(f"bench: {error}", file=sys.stderr)
            return 1
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def run_in_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop when it is installed (it comes with ``uvicorn[standard]``
    and halves the client's CPU per request), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def _bench(plan: BenchPlan, args: argparse.Namespace, progress: Progress) -> BenchReport:
    bodies: Bodies
    if args.body_file:
        bodies = read_body_file(args.body_file)
    elif args.body is not None:
        bodies = parse_body(args.body)
    else:
        bodies = await bodies_from_service(plan.endpoint, plan.timeout_s)
    return await run_bench(plan, bodies, progress)


def _reason(error: Exception, endpoint: Endpoint) -> str:
    if isinstance(error, BodyError):
        return str(error)
    return f"cannot talk to {endpoint.base}: {error}"


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected integers like 1,16,64, got {text!r}") from error


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected numbers like 100,500, got {text!r}") from error


def _header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise ValueError(f"a header is 'Name: value', got {text!r}")
    return name.strip(), value.strip()
