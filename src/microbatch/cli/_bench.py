"""``microbatch bench URL``: load a running server (:mod:`microbatch.bench`), print what it did."""

from __future__ import annotations

import json
import sys

from ..bench.bodies import Bodies, BodyError, bodies_from_service, parse_body, read_body_file
from ..bench.client import ConnectionClosed, Endpoint, RequestTimeout
from ..bench.parser import ProtocolError
from ..bench.progress import Progress
from ..bench.report import PlotUnavailable, plot, to_json, to_text
from ..bench.runner import BenchPlan, BenchReport, run_bench, run_in_event_loop
from ._options import Parsed

__all__ = ["run"]


def run(args: Parsed) -> int:
    """Run ``bench`` with parsed arguments; return the exit status (1: could not run)."""
    try:
        headers = [_header(text) for text in args.header]
        token = args.auth_token
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


async def _bench(plan: BenchPlan, args: Parsed, progress: Progress) -> BenchReport:
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


def _header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise ValueError(f"a header is 'Name: value', got {text!r}")
    return name.strip(), value.strip()
