"""The interpreter's switch interval while ``microbatch serve`` serves a stage that
steps in a thread: shortened by default, set by ``--switch-interval-ms``, left alone
for other stages, restored after serving."""

from __future__ import annotations

import json
import sys

import httpx
import pytest

from microbatch import Stage, batch
from microbatch.cli._options import parse
from microbatch.cli._serving import serve_settings
from microbatch.serve.switch_interval import (
    STEP_THREAD_SWITCH_INTERVAL_S,
    steps_in_thread,
    switch_interval,
    switch_interval_for,
)

from . import switch_interval_served as served
from .test_server import HANG_GUARD_S, running


def test_the_interval_is_set_inside_the_block_and_restored_after() -> None:
    before = sys.getswitchinterval()
    with switch_interval(0.00025):
        assert sys.getswitchinterval() == pytest.approx(0.00025)
    assert sys.getswitchinterval() == before


def test_the_interval_is_restored_when_the_block_raises() -> None:
    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError), switch_interval(0.00025):
        raise RuntimeError("serving failed")
    assert sys.getswitchinterval() == before


def test_none_leaves_the_interval_alone() -> None:
    before = sys.getswitchinterval()
    with switch_interval(None):
        assert sys.getswitchinterval() == before


@batch(max_batch_size=2)
def echo(items: list[int]) -> list[int]:
    """A batched function: no stages."""
    return items


def test_only_a_stage_that_steps_in_a_thread_counts() -> None:
    assert steps_in_thread([served.steps])
    assert steps_in_thread([served.batch, served.steps])
    assert not steps_in_thread([served.batch])
    assert not steps_in_thread([echo])
    in_process = Stage(served.SwitchIntervalSteps, mode="process", max_batch_size=2)
    assert not steps_in_thread([type("WithStages", (), {"stages": (in_process,)})()])


def test_the_interval_served_with() -> None:
    assert switch_interval_for([served.steps], None) == STEP_THREAD_SWITCH_INTERVAL_S
    assert switch_interval_for([served.batch], None) is None
    assert switch_interval_for([served.batch], 0.002) == 0.002
    assert switch_interval_for([served.steps], 0.002) == 0.002


def test_the_flag_reaches_the_settings_and_is_refused_with_ray() -> None:
    target = "tests.serve.switch_interval_served:steps"
    options = parse(["serve", target, "--switch-interval-ms", "2"])
    assert serve_settings(options, [served.steps]).switch_interval_s == pytest.approx(0.002)
    assert serve_settings(parse(["serve", target]), [served.steps]).switch_interval_s == (
        STEP_THREAD_SWITCH_INTERVAL_S
    )
    with pytest.raises(SystemExit):
        parse(["serve", target, "--ray", "--switch-interval-ms", "2"])


def _streamed(url: str) -> float:
    with httpx.Client(base_url=url, timeout=HANG_GUARD_S) as client:
        reply = client.post("/stream", json=1, headers={"accept": "application/x-ndjson"})
    first = json.loads(reply.text.splitlines()[0])
    return float(first["chunk"])


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ((), STEP_THREAD_SWITCH_INTERVAL_S),
        (("--switch-interval-ms", "2"), 0.002),
        (("--workers", "2"), STEP_THREAD_SWITCH_INTERVAL_S),  # the hub steps
    ],
    ids=["default", "flag", "workers-hub"],
)
def test_a_served_step_runs_under_the_interval(options: tuple[str, ...], expected: float) -> None:
    with running(served.__name__ + ":steps", "--log-level", "warning", *options) as server:
        assert _streamed(server.url) == pytest.approx(expected)


def test_a_served_batch_stage_keeps_pythons_interval() -> None:
    with (
        running(served.__name__ + ":batch", "--log-level", "warning") as server,
        httpx.Client(base_url=server.url, timeout=HANG_GUARD_S) as client,
    ):
        reply = client.post("/predict", json=1)
        assert reply.status_code == 200
        assert reply.json() == pytest.approx(0.005)  # Python's default
