"""``microbatch top URL``: a live view of a running server (needs microbatch[top])."""

from __future__ import annotations

import sys

from ._options import Parsed

__all__ = ["run"]


def run(options: Parsed) -> int:
    """Run ``microbatch top``; the exit status (2 without rich)."""
    try:
        from ..top.live import run_top
    except ImportError as error:
        print(
            f"microbatch top needs rich: pip install 'microbatch[top]' ({error})", file=sys.stderr
        )
        return 2
    return run_top(options.url, options.interval, options.auth_token or None)
