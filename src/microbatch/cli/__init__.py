"""The ``microbatch`` command line: argv and the environment are read here only."""

from .main import main

__all__ = ["main"]
