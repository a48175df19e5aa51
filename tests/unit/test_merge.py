"""Rows of many callers merged into one batch and split back."""

from __future__ import annotations

import numpy as np
import pytest

from microbatch import BatchConfig, ListRows, NumpyRows, ResultLengthError
from microbatch.merge import merged, split_rows


def test_list_rows_round_trip() -> None:
    fmt = ListRows()
    items = [[1, 2, 3], [4], [5, 6]]
    batch = fmt.merge(items)
    assert batch == [1, 2, 3, 4, 5, 6]
    assert fmt.split([x * 2 for x in batch], [3, 1, 2]) == [[2, 4, 6], [8], [10, 12]]


def test_list_rows_error_row_fails_its_item_only() -> None:
    fmt = ListRows()
    error = ValueError("row 4")
    parts = fmt.split([1, 2, 3, error, 5, 6], [3, 1, 2])
    assert parts == [[1, 2, 3], error, [5, 6]]


def test_wrong_row_count_fails_every_item() -> None:
    parts = ListRows().split([1, 2], [2, 1])
    assert len(parts) == 2 and all(isinstance(p, ResultLengthError) for p in parts)


def test_numpy_rows_round_trip_without_copies_on_split() -> None:
    fmt = NumpyRows()
    items = [np.ones((2, 3)), np.zeros((1, 3)), np.full((4, 3), 7.0)]
    batch = fmt.merge(items)
    assert batch.shape == (7, 3)
    parts = fmt.split(batch * 2, [2, 1, 4])
    assert [p.shape for p in parts] == [(2, 3), (1, 3), (4, 3)]
    assert np.all(parts[2] == 14.0)
    assert np.shares_memory(parts[0], parts[1]) is False
    assert fmt.join([parts[0], parts[1]]).shape == (3, 3)


def test_split_rows_cuts_large_items_into_parts() -> None:
    fmt = ListRows()
    assert split_rows(fmt, list(range(5)), 8) == [(list(range(5)), 5)]
    parts = split_rows(fmt, list(range(10)), 4)
    assert parts == [([0, 1, 2, 3], 4), ([4, 5, 6, 7], 4), ([8, 9], 2)]
    assert split_rows(fmt, [], 4) == [([], 1)]


def test_merged_wraps_a_row_function() -> None:
    run = merged(lambda rows: [r * 3 for r in rows], ListRows())
    assert run([[1, 2], [3]]) == [[3, 6], [9]]


def test_row_format_names() -> None:
    assert isinstance(BatchConfig(rows="list").row_format(), ListRows)
    assert isinstance(BatchConfig(rows="numpy").row_format(), NumpyRows)
    assert BatchConfig().row_format() is None
    custom = ListRows()
    assert BatchConfig(rows=custom).row_format() is custom
    with pytest.raises(ValueError, match="rows"):
        BatchConfig(rows=object())  # type: ignore[arg-type]
