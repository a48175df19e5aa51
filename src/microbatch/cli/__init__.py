"""The ``microbatch`` command line: argv and the environment are read here only."""

from ._main import main

__all__ = ["main"]
