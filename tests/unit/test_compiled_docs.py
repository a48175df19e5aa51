"""A public class the wheel compiles gets its docstring back from its source."""

from __future__ import annotations

import microbatch
from microbatch._compiled_docs import restore_docstring


class Documented:
    """Said in the source."""


def test_a_dropped_docstring_is_read_back_from_the_source() -> None:
    Documented.__doc__ = ""  # as mypyc leaves a compiled class
    restore_docstring(Documented)
    assert Documented.__doc__ == "Said in the source."


def test_a_kept_docstring_is_left_as_it_is() -> None:
    class Kept:
        """Its own."""

    Kept.__doc__ = "changed"
    restore_docstring(Kept)
    assert Kept.__doc__ == "changed"


def test_the_queue_state_has_its_docstring_in_either_build() -> None:
    doc = microbatch.QueueState.__doc__
    assert doc is not None and doc.startswith("What a policy may know about a batcher's queue.")
