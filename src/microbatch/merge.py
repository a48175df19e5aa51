"""Variable-size items: merge the rows of many callers into one batch, split results back.

With ``rows=...`` an item is a sequence of rows (a caller sends 7 texts, another 3).
The batch function receives the rows of every item in the batch merged into one
input, returns one result per row, and each caller gets the results of its own rows.
An item with more rows than ``max_batch_size`` is cut into parts that run in
different batches; its results are joined back in order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from itertools import accumulate, pairwise
from typing import Any, Protocol, runtime_checkable

from .errors import ResultLengthError

__all__ = [
    "ListRows",
    "NumpyRows",
    "RowFormat",
    "merged",
    "merged_async",
    "split_rows",
]


@runtime_checkable
class RowFormat(Protocol):
    """How items made of rows are counted, cut, merged and split."""

    def count(self, item: Any) -> int:
        """Number of rows in ``item``."""

    def cut(self, item: Any, start: int, stop: int) -> Any:
        """Rows ``start:stop`` of ``item``, as an item."""

    def merge(self, items: list[Any]) -> Any:
        """One batch input holding the rows of ``items`` in order."""

    def split(self, result: Any, counts: list[int]) -> list[Any]:
        """Cut the batch result into one result per item of ``counts`` rows each.

        A part may be an exception instance, which fails that item only.
        """

    def join(self, parts: list[Any]) -> Any:
        """Join the results of an item's parts back into one result."""


class ListRows:
    """Items are lists of rows; the function gets one flat list, returns a flat list.

    A row result that is an exception instance fails the item that row belongs to.
    """

    def count(self, item: Sequence[Any]) -> int:
        """``len(item)``."""
        return len(item)

    def cut(self, item: Sequence[Any], start: int, stop: int) -> list[Any]:
        """``list(item[start:stop])``."""
        return list(item[start:stop])

    def merge(self, items: list[Sequence[Any]]) -> list[Any]:
        """All rows of all items, in order."""
        return [row for item in items for row in item]

    def split(self, result: Any, counts: list[int]) -> list[Any]:
        """One list of results per item; an item with an exception row gets that exception."""
        rows = _rows_of(result, sum(counts))
        parts = rows if isinstance(rows, ResultLengthError) else _cut_by_counts(rows, counts)
        if isinstance(parts, ResultLengthError):
            return [parts] * len(counts)
        return [_first_error(part) or list(part) for part in parts]

    def join(self, parts: list[list[Any]]) -> list[Any]:
        """Concatenate the part results."""
        return [row for part in parts for row in part]


class NumpyRows:
    """Items are numpy arrays whose first axis is rows.

    The function gets one concatenated array and returns an array (or anything
    sliceable) with one entry per row; each caller gets its own slice.
    """

    def count(self, item: Any) -> int:
        """Length of the first axis."""
        return len(item)

    def cut(self, item: Any, start: int, stop: int) -> Any:
        """``item[start:stop]`` (a view, no copy)."""
        return item[start:stop]

    def merge(self, items: list[Any]) -> Any:
        """``numpy.concatenate`` along the first axis."""
        import numpy as np  # optional dependency: imported only by users of this format

        return np.concatenate(items, axis=0) if len(items) > 1 else np.asarray(items[0])

    def split(self, result: Any, counts: list[int]) -> list[Any]:
        """Slices of ``result`` (views), one per item."""
        parts = _cut_by_counts(result, counts)
        return [parts] * len(counts) if isinstance(parts, ResultLengthError) else parts

    def join(self, parts: list[Any]) -> Any:
        """``numpy.concatenate`` of the part results."""
        import numpy as np

        return np.concatenate(parts, axis=0)


def split_rows(fmt: RowFormat, item: Any, limit: int) -> list[tuple[Any, int]]:
    """Cut ``item`` into parts of at most ``limit`` rows: ``[(part, rows), ...]``.

    An empty item is one part of size 1, so it still takes a place in a batch.
    """
    total = fmt.count(item)
    if total <= limit:
        return [(item, max(total, 1))]
    return [
        (fmt.cut(item, start, min(start + limit, total)), min(limit, total - start))
        for start in range(0, total, limit)
    ]


def merged(fn: Callable[[Any], Any], fmt: RowFormat) -> Callable[[list[Any]], list[Any]]:
    """Wrap a function over merged rows into a function over a list of items."""

    def run_merged(items: list[Any]) -> list[Any]:
        return fmt.split(fn(fmt.merge(items)), [fmt.count(item) for item in items])

    return run_merged


def merged_async(
    fn: Callable[[Any], Awaitable[Any]], fmt: RowFormat
) -> Callable[[list[Any]], Awaitable[list[Any]]]:
    """:func:`merged` for a function that returns an awaitable."""

    async def run_merged(items: list[Any]) -> list[Any]:
        return fmt.split(await fn(fmt.merge(items)), [fmt.count(item) for item in items])

    return run_merged


def _cut_by_counts(result: Any, counts: list[int]) -> list[Any] | ResultLengthError:
    total = sum(counts)
    try:
        length = len(result)
    except TypeError:
        length = -1
    if length != total:
        return ResultLengthError(
            f"the batch function returned {length if length >= 0 else 'no sequence'}"
            f" results for {total} rows"
        )
    bounds = [0, *accumulate(counts)]
    return [result[start:stop] for start, stop in pairwise(bounds)]


def _rows_of(result: Any, total: int) -> list[Any] | ResultLengthError:
    """``result`` as a list of ``total`` rows: its ``len()`` and what iterating it
    yields must both count them (a DataFrame has rows but iterates column names)."""
    if type(result) is list:
        return result
    try:
        length, rows = len(result), list(result)
    except TypeError:
        return ResultLengthError(f"the batch function returned no sequence for {total} rows")
    if length != len(rows):
        return ResultLengthError(
            f"the batch function returned {type(result).__name__} of length {length}"
            f" that iterates {len(rows)} values, for {total} rows"
        )
    return rows


def _first_error(rows: Any) -> BaseException | None:
    for row in rows:
        if isinstance(row, BaseException):
            return row
    return None
