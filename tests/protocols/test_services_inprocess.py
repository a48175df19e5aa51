"""Several services in one ASGI app, in-process: readiness of all, drain, a service
that fails to start, names."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from microbatch.http import HttpConfig, Services
from microbatch.stats import ServiceStats
from microbatch.types import Route
from tests.http.conftest import serving

from .models import double, shout


class Broken:
    """A servable whose start fails."""

    name = "broken"
    input_type: Any = str
    output_type: Any = str
    routes: Mapping[str, Route] = {}
    examples: Sequence[Any] = ()
    ready = False

    async def start(self) -> None:
        raise RuntimeError("no weights")

    async def close(self) -> None:
        pass

    async def submit(
        self, item: Any, *, deadline: float | None = None, route: str | None = None
    ) -> Any:
        raise AssertionError("never started")

    def stats(self) -> ServiceStats:
        return ServiceStats(False, False, 0, ())


async def test_ready_when_every_service_is_and_not_while_draining() -> None:
    app = Services([double, shout], HttpConfig())
    async with serving(app) as client:  # type: ignore[arg-type]
        assert (await client.get("/health/ready")).status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 200
        assert (await client.post("/shout/predict", json="a")).json() == "A"
        assert (await client.get("/double/health/ready")).status_code == 200
        app.begin_draining()
        assert (await client.get("/health/ready")).status_code == 503
        assert (await client.get("/v2/health/ready")).status_code == 503
        assert (await client.get("/v2/models/shout/ready")).status_code == 503
        assert (await client.post("/shout/predict", json="a")).status_code == 503


async def test_a_service_that_fails_to_start_fails_the_app_and_closes_the_others() -> None:
    broken = Broken()
    app = Services([shout, broken], HttpConfig())  # type: ignore[list-item]
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await inbox.put({"type": "lifespan.startup"})
    await app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, send)
    assert sent[-1]["type"] == "lifespan.startup.failed"
    assert "no weights" in sent[-1]["message"]
    assert not shout.ready  # started, then closed again


def test_names_must_differ_and_there_must_be_one() -> None:
    with pytest.raises(ValueError, match="two services are named 'shout'"):
        Services([shout, shout], HttpConfig())
    with pytest.raises(ValueError, match="at least one"):
        Services([], HttpConfig())


async def test_the_token_guards_the_shared_routes_too() -> None:
    app = Services([double, shout], HttpConfig(auth_token="sesame"))
    async with serving(app) as client:  # type: ignore[arg-type]
        assert (await client.get("/health/ready")).status_code == 200
        assert (await client.get("/v2")).status_code == 401
        headers = {"authorization": "Bearer sesame"}
        assert (await client.get("/v2", headers=headers)).status_code == 200
        assert (await client.post("/shout/predict", json="a")).status_code == 401
        assert (await client.get("/nowhere")).status_code == 404


async def test_one_metrics_page_labels_each_service() -> None:
    app = Services([double, shout], HttpConfig())
    async with serving(app) as client:  # type: ignore[arg-type]
        await client.post("/shout/predict", json="a")
        await client.get("/v2/models/double")
        text = (await client.get("/metrics")).text
    names = [family.name for family in text_string_to_metric_families(text)]
    assert len(names) == len(set(names))  # a valid page: each family once
    assert 'microbatch_ready{service="double"} 1.0' in text
    assert 'microbatch_ready{service="shout"} 1.0' in text
    assert text.count("# TYPE microbatch_ready gauge") == 1
    assert text.count("# TYPE process_cpu_seconds_total counter") == 1
    shout_requests = [
        line for line in text.splitlines() if 'service="shout"' in line and "/predict" in line
    ]
    assert any(line.startswith("microbatch_http_requests_total") for line in shout_requests)
    assert any('service="*"' in line and "/v2/models/double" in line for line in text.splitlines())
