"""The messages of ``serve --workers``: small frozen dataclasses that survive the
relay's pickling unchanged, compactly (fields by position, not by name)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from microbatch.http.metrics import RequestCounts
from microbatch.serve import _messages as messages
from microbatch.stats import ServiceStats

EVERY = [
    messages.Hello(),
    messages.Submit(7, b"item", 123.5, "Double"),
    messages.Submit(8, b"item", None, None),
    messages.Cancel(7),
    messages.Counts(RequestCounts()),
    messages.Result(7, b"outcome"),
    messages.State(True, ServiceStats(True, False, 0, ()), RequestCounts()),
]


@pytest.mark.parametrize("message", EVERY, ids=lambda m: type(m).__name__)
def test_each_message_is_a_frozen_slotted_dataclass_that_pickles_as_itself(
    message: object,
) -> None:
    assert dataclasses.is_dataclass(message)
    assert not hasattr(message, "__dict__")
    assert type(message).__dataclass_params__.frozen  # type: ignore[union-attr]
    for field in dataclasses.fields(message):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(message, field.name, None)
    again = pickle.loads(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(again) is type(message)
    assert again == message


def test_field_names_do_not_travel() -> None:
    packed = pickle.dumps(messages.Submit(1, b"x", 2.0, "route"), pickle.HIGHEST_PROTOCOL)
    assert b"request_id" not in packed and b"deadline" not in packed


def test_the_two_directions_are_told_apart_by_type() -> None:
    front = [m for m in EVERY if isinstance(m, messages.FrontMessage)]
    hub = [m for m in EVERY if isinstance(m, messages.HubMessage)]
    assert {type(m) for m in front} == {
        messages.Hello,
        messages.Submit,
        messages.Cancel,
        messages.Counts,
    }
    assert {type(m) for m in hub} == {messages.Result, messages.State}
