"""``microbatch tune MODULE:ATTR``: measure (:mod:`microbatch.tune`), advise, print."""

from __future__ import annotations

import asyncio
import json
import sys

from ..tune.advice import recommend
from ..tune.measure import TuneError, load_service, measure_service, measure_serving
from ..tune.report import PlotUnavailable, plot, to_json, to_text
from ._options import Parsed

__all__ = ["run"]


def run(args: Parsed) -> int:
    """Run ``tune`` with parsed arguments; return the exit status."""
    if args.max_batch < 1 or args.repeats < 1 or args.warmup < 0 or not args.p99_ms > 0:
        print(
            "tune: need --max-batch >= 1, --repeats >= 1, --warmup >= 0, --p99-ms > 0",
            file=sys.stderr,
        )
        return 2
    try:
        service = load_service(args.target)
        curves = measure_service(
            service,
            max_batch=args.max_batch,
            repeats=args.repeats,
            warmup=args.warmup,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        print("serving path: timing the HTTP app over an instant model", file=sys.stderr)
        serving = asyncio.run(measure_serving(service))
    except TuneError as exc:
        print(f"tune: {exc}", file=sys.stderr)
        return 1
    advice = recommend(curves, args.p99_ms, gain=args.gain, serving_items_per_s=serving)
    if args.json:
        print(json.dumps(to_json(advice, args.target), indent=2))
    else:
        print(to_text(advice, args.target))
    if args.plot:
        try:
            plot(advice, args.plot, args.target)
        except PlotUnavailable as exc:
            print(f"tune: {exc}", file=sys.stderr)
            return 1
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
