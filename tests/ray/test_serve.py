"""An unchanged Service on a local Ray instance: 2 replicas, microbatch batching inside.

Through a ``DeploymentHandle`` (``ServiceClient``) and through Ray Serve's HTTP proxy
on 127.0.0.1. Timeouts here are hang guards, never pass criteria.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
import ray
from ray import serve

import microbatch
from microbatch import Service, Stage
from microbatch.http import HttpConfig
from microbatch.ray import ServiceClient, application
from microbatch.stats import ServiceStats

from . import models
from .conftest import Cluster
from .models import POISON, SLOW, Point, Tagged

pytestmark = pytest.mark.timeout(180)

HANG_GUARD_S = 60.0
SPREAD_WAVES = 5
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


@dataclass(frozen=True)
class Deployed:
    """The service (2 replicas) and the batched function (1 replica), deployed."""

    url: str
    service: Any  # DeploymentHandle
    function: Any


@pytest.fixture(scope="module")
def deployed(cluster: Cluster) -> Iterator[Deployed]:
    service = serve.run(application(models.service, num_replicas=2, num_cpus=0.25), name="double")
    function = serve.run(
        application(models.triple, num_cpus=0.25), name="triple", route_prefix="/fn"
    )
    yield Deployed(cluster.url, service, function)


async def outcome(awaitable: Awaitable[Any]) -> Any:
    """The result, or the exception raised in its place."""
    try:
        return await awaitable
    except Exception as error:
        return error


async def replicas_seen(wave: Callable[[int], Awaitable[set[str]]]) -> set[str]:
    """Run ``wave(n)`` (it checks every answer of wave ``n`` and returns the
    replicas that gave them) until both replicas have answered, at most
    ``SPREAD_WAVES`` times: Ray's router may send one whole wave to one replica of
    a loaded machine, but not every wave."""
    seen: set[str] = set()
    for n in range(SPREAD_WAVES):
        seen |= await wave(n)
        if len(seen) == 2:
            break
    return seen


async def test_concurrent_items_get_their_own_answers_from_both_replicas(
    deployed: Deployed,
) -> None:
    client = ServiceClient(deployed.service)

    async def wave(n: int) -> set[str]:
        xs = [n * 1000 + i + 0.5 for i in range(200)]
        answers = await asyncio.gather(*(client.submit(Point(x)) for x in xs))
        assert [answer.y for answer in answers] == [2 * x for x in xs]
        return {answer.replica for answer in answers}

    assert len(await replicas_seen(wave)) == 2
    stats: ServiceStats = await deployed.service.stats.remote()
    assert stats.ready and stats.stages[0].batching.items > 0


async def test_http_through_the_ray_proxy_answers_each_request_with_its_own_result(
    deployed: Deployed,
) -> None:
    async with httpx.AsyncClient(base_url=deployed.url, timeout=HANG_GUARD_S) as http:

        async def wave(n: int) -> set[str]:
            xs = [n * 1000 + i + 0.25 for i in range(100)]
            replies = await asyncio.gather(*(http.post("/predict", json={"x": x}) for x in xs))
            assert [r.status_code for r in replies] == [200] * len(xs)
            assert [r.json()["y"] for r in replies] == [2 * x for x in xs]
            return {r.json()["replica"] for r in replies}

        assert len(await replicas_seen(wave)) == 2


async def test_http_routes_codecs_and_status_codes_are_microbatch_serves(
    deployed: Deployed,
) -> None:
    async with httpx.AsyncClient(base_url=deployed.url, timeout=HANG_GUARD_S) as http:
        packed = await http.post(
            "/predict", content=msgspec.msgpack.encode({"x": 1.5}), headers=MSGPACK
        )
        assert packed.headers["content-type"] == "application/msgpack"
        assert msgspec.msgpack.decode(packed.content)["y"] == 3.0
        invalid = await http.post("/predict", json={"x": "one"})
        assert (invalid.status_code, invalid.json()["error"]) == (422, "ValidationError")
        assert "$.x" in invalid.json()["message"]
        malformed = await http.post(
            "/predict", content=b"{", headers={"content-type": "application/json"}
        )
        assert malformed.status_code == 400
        assert (
            await http.post("/predict", content=b"x=1", headers={"content-type": "text/plain"})
        ).status_code == 415
        assert (
            await http.post("/predict", json={"x": 1}, headers={"accept": "text/html"})
        ).status_code == 406
        assert (
            await http.post("/predict", json={"x": 1}, headers={"x-request-timeout-ms": "soon"})
        ).status_code == 400
        assert (await http.get("/predict")).status_code == 405
        assert (await http.get("/nowhere")).status_code == 404
        assert (await http.get("/health/live")).status_code == 200
        assert (await http.get("/health/ready")).json() == {"status": "ready"}
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200 and "microbatch_http_requests_total" in metrics.text
        openapi = await http.get("/openapi.json")
        assert openapi.json()["paths"]["/predict"]["post"]


async def test_a_poison_item_fails_alone(deployed: Deployed) -> None:
    client = ServiceClient(deployed.service)
    xs = [float(i) for i in range(20, 52)]
    xs[10] = POISON
    outcomes = await asyncio.gather(*(outcome(client.submit(Point(x))) for x in xs))
    assert isinstance(outcomes[10], ValueError) and str(outcomes[10]) == "poison"
    assert [o.y for i, o in enumerate(outcomes) if i != 10] == [2 * x for x in xs if x != POISON]
    async with httpx.AsyncClient(base_url=deployed.url, timeout=HANG_GUARD_S) as http:
        replies = await asyncio.gather(*(http.post("/predict", json={"x": x}) for x in xs))
    assert [r.status_code for r in replies] == [500 if x == POISON else 200 for x in xs]
    assert replies[10].json()["error"] == "ModelError"
    assert "poison" not in replies[10].text  # the model's message stays in the replica's log


async def test_a_deadline_is_kept_inside_the_replica(deployed: Deployed) -> None:
    client = ServiceClient(deployed.service)
    with pytest.raises(microbatch.DeadlineExceeded):
        await client.submit(Point(SLOW), timeout_s=0.05)
    async with httpx.AsyncClient(base_url=deployed.url, timeout=HANG_GUARD_S) as http:
        late = await http.post("/predict", json={"x": SLOW}, headers={"x-request-timeout-ms": "50"})
    assert (late.status_code, late.json()["error"]) == (504, "DeadlineExceeded")


async def test_handle_callers_get_the_default_deadline_http_callers_get(cluster: Cluster) -> None:
    """No ``timeout_s``: the deployment's default timeout (here 0.3 s, like
    ``--timeout-ms 300``), not no deadline at all; a longer one is capped by it."""
    short = HttpConfig(default_timeout_s=0.3)
    handle = serve.run(
        application(models.service, num_cpus=0.25, http=short), name="short", route_prefix="/short"
    )
    client = ServiceClient(handle)
    try:
        assert (await client.submit(Point(2.0))).y == 4.0
        with pytest.raises(microbatch.DeadlineExceeded):
            await client.submit(Point(SLOW))  # the model takes 1 s
        with pytest.raises(microbatch.DeadlineExceeded):
            await client.submit(Point(SLOW), timeout_s=HANG_GUARD_S)
        with pytest.raises(ValueError, match="timeout_s must be a number >= 0"):
            await client.submit(Point(1.0), timeout_s=-1.0)
        async with httpx.AsyncClient(base_url=cluster.url, timeout=HANG_GUARD_S) as http:
            late = await http.post("/short/predict", json={"x": SLOW})
        assert (late.status_code, late.json()["error"]) == (504, "DeadlineExceeded")
    finally:
        serve.delete("short")


async def test_a_batched_function_is_served_under_a_route_prefix(deployed: Deployed) -> None:
    client = ServiceClient(deployed.function)
    assert await asyncio.gather(*(client.submit(i) for i in range(50))) == [
        3 * i for i in range(50)
    ]
    async with httpx.AsyncClient(base_url=deployed.url, timeout=HANG_GUARD_S) as http:
        reply = await http.post("/fn/predict", json=5)
        ready = await http.get("/fn/health/ready")
    assert (reply.status_code, reply.json()) == (200, 15)
    assert ready.status_code == 200


def test_blocking_callers_use_the_same_handle(deployed: Deployed) -> None:
    client = ServiceClient(deployed.service)
    assert client.submit_blocking(Point(4.0)).y == 8.0
    with pytest.raises(ValueError, match="poison"):
        client.submit_blocking(Point(POISON))


async def test_a_full_replica_answers_overloaded_at_once(cluster: Cluster) -> None:
    gate = models.Gate.options(name="overload-gate", namespace=models.NAMESPACE).remote()
    full = Service(Stage(models.Held, workers=2, kwargs={"gate": "overload-gate"}), max_in_flight=2)
    handle = serve.run(application(full, num_cpus=0.25), name="full", route_prefix="/full")
    client = ServiceClient(handle)
    inside = [asyncio.ensure_future(client.submit(x)) for x in (1.0, 2.0)]
    await gate.arrivals.remote(2)
    with pytest.raises(microbatch.Overloaded):
        await client.submit(3.0)
    async with httpx.AsyncClient(base_url=cluster.url, timeout=HANG_GUARD_S) as http:
        refused = await http.post("/full/predict", json=4.0)
    assert (refused.status_code, refused.json()["error"]) == (503, "Overloaded")
    assert refused.headers["retry-after"] == "1"
    await gate.open.remote()
    assert [(await answer).y for answer in inside] == [2.0, 4.0]
    serve.delete("full")


async def test_a_killed_replica_loses_only_the_items_it_held(cluster: Cluster) -> None:
    gate = models.Gate.options(name=models.GATE_NAME, namespace=models.NAMESPACE).remote()
    handle = serve.run(
        application(models.held, num_replicas=2, num_cpus=0.25), name="held", route_prefix="/held"
    )
    client = ServiceClient(handle)
    by_handle = {
        float(i): asyncio.ensure_future(outcome(client.submit(float(i)))) for i in range(10)
    }
    async with httpx.AsyncClient(base_url=cluster.url, timeout=HANG_GUARD_S) as http:
        by_http = {
            100.0 + i: asyncio.ensure_future(http.post("/held/predict", json=100.0 + i))
            for i in range(6)
        }
        arrived: dict[str, list[float]] = await gate.arrivals.remote(16)
        victim = max(arrived, key=lambda name: len(arrived[name]))
        held_by_victim = set(arrived[victim])
        ray.kill(ray.get_actor(victim, namespace="serve"))

        # The victim's items fail (the gate is still shut: nothing else can finish).
        for x in sorted(held_by_victim):
            if x in by_handle:
                assert isinstance(await by_handle[x], microbatch.WorkerDied)
            else:
                assert (await by_http[x]).status_code == 500  # Ray's proxy answers this one
        await gate.open.remote()
        for x, pending in by_handle.items():
            if x not in held_by_victim:
                answer = await pending
                assert isinstance(answer, Tagged) and answer.y == 2 * x
                assert answer.replica != victim
        for x, pending_reply in by_http.items():
            if x not in held_by_victim:
                reply = await pending_reply
                assert reply.status_code == 200 and reply.json()["y"] == 2 * x

        # Exactly once: each item reached a model once, none was run again elsewhere.
        computed = sorted(x for xs in arrived.values() for x in xs)
        assert computed == sorted([*by_handle, *by_http])

        # Ray replaces the replica; nothing sent afterwards is lost.
        await until_running("held", replicas=2)
        again = await asyncio.gather(*(client.submit(float(i)) for i in range(200, 220)))
        assert [a.y for a in again] == [2.0 * i for i in range(200, 220)]
        replies = await asyncio.gather(
            *(http.post("/held/predict", json=300.0 + i) for i in range(10))
        )
        assert [r.status_code for r in replies] == [200] * 10


async def until_running(app: str, replicas: int) -> None:
    """Wait (bounded) until the app's deployment is healthy with ``replicas`` running."""
    give_up = time.monotonic() + HANG_GUARD_S
    while True:
        status = serve.status().applications[app]
        (deployment,) = status.deployments.values()
        if deployment.status == "HEALTHY" and deployment.replica_states.get("RUNNING") == replicas:
            return
        assert time.monotonic() < give_up, f"{app} did not come back: {deployment}"
        await asyncio.sleep(0.1)  # a test watching state it cannot subscribe to
