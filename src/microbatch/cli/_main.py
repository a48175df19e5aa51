"""The ``microbatch`` command: parse the command line (:mod:`._options`), run the command.

Each command's module is imported when it runs, so that ``bench`` needs neither
the HTTP server nor Ray, and ``serve --ray`` without Ray is a clear message.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._options import parse

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``microbatch`` command; return the exit status.

    Raises:
        SystemExit: With status 2, for a bad command line (argparse's message).
    """
    options = parse(argv)
    if options.command == "serve":
        if options.ray:
            from ._on_ray import run_serve_on_ray

            return run_serve_on_ray(options)
        from ._serving import run_serve

        return run_serve(options)
    if options.command == "bench":
        from ._bench import run as run_bench

        return run_bench(options)
    if options.command == "top":
        from ._top import run as run_top

        return run_top(options)
    if options.command == "tune":
        from ._tune import run as run_tune

        return run_tune(options)
    from ._demo import run as run_demo

    return run_demo(options)


if __name__ == "__main__":
    raise SystemExit(main())
