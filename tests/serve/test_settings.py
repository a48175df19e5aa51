"""The connection limits from the command line reach the server's settings and its
connections."""

from __future__ import annotations

import pytest

from microbatch.cli._options import parse
from microbatch.cli._serving import http_config, serve_settings
from microbatch.http.app import HttpApp
from microbatch.serve.server import limits_of

from .connection_harness import Doubler

LIMIT_FLAGS = ["--max-header-bytes", "2048", "--keep-alive-s", "2.5", "--max-connections", "7"]


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["plain", "workers"])
def test_connection_limits_reach_the_connections(workers: list[str]) -> None:
    parsed = parse(
        ["serve", "tests.http.models:double", *workers, *LIMIT_FLAGS, "--body-timeout-s", "3"]
    )
    settings = serve_settings(parsed)
    app = HttpApp(Doubler(), http_config(parsed))  # type: ignore[arg-type]
    limits = limits_of(app, settings)
    assert (limits.max_header_bytes, limits.keep_alive_s, limits.max_connections) == (2048, 2.5, 7)
    assert limits.body_timeout_s == 3.0


def test_connection_limits_are_refused_with_ray() -> None:
    with pytest.raises(SystemExit):
        parse(["serve", "tests.http.models:double", "--ray", "--keep-alive-s", "2"])
