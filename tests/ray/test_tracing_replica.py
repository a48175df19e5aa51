"""Issue 19, traces through a real Ray replica: ``ServiceClient`` callers' spans are
the parents of the items' spans in the replica (which exports them to a file)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from ray import serve

from microbatch.http import HttpConfig
from microbatch.ray import ServiceClient, application

from . import traced_models
from .conftest import Cluster

pytestmark = pytest.mark.timeout(180)
HANG_GUARD_S = 60.0
ITEMS = 6


def read_lines(path: Path) -> list[str]:
    """The file's lines (a plain function: no blocking call in the async test)."""
    return path.read_text().splitlines()


@pytest.fixture
def spans_file(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "spans.jsonl"


async def test_a_replicas_item_spans_are_children_of_the_callers_span(
    cluster: Cluster, spans_file: Path
) -> None:
    env = {traced_models.SPANS_FILE: str(spans_file)}
    handle = serve.run(
        application(
            traced_models.service,
            http=HttpConfig(tracing=True),
            num_cpus=0.25,
            ray_actor_options={"runtime_env": {"env_vars": env}},
        ),
        name="traced",
        route_prefix="/traced",
    )
    try:
        client = ServiceClient(handle)
        caller = TracerProvider().get_tracer("caller")
        sent = []
        calls = []
        for index in range(ITEMS):
            with caller.start_as_current_span(f"caller {index}") as span:
                context = span.get_span_context()
                sent.append((context.trace_id, context.span_id))
                # a task takes the current context (the span) along
                calls.append(asyncio.ensure_future(client.submit(traced_models.Point(index + 0.5))))
        results = await asyncio.wait_for(asyncio.gather(*calls), HANG_GUARD_S)
    finally:
        serve.delete("traced")
    assert results == [2 * (index + 0.5) for index in range(ITEMS)]
    spans = [json.loads(line) for line in read_lines(spans_file)]
    items = {span["trace_id"]: span for span in spans if span["name"] == "microbatch replica"}
    assert len(items) == ITEMS
    for trace_id, parent in sent:
        assert items[trace_id]["parent"] == parent  # the caller's span, across Ray
    item_ids = {span["span_id"] for span in items.values()}
    stages = [span for span in spans if span["name"] == "Double"]
    assert len(stages) == ITEMS and all(span["parent"] in item_ids for span in stages)
    linked = {link for span in spans if span["name"] == "batch Double" for link in span["links"]}
    assert linked == item_ids
