"""``serve --ray``'s flags reach the deployment (or are refused: tests/cli)."""

from __future__ import annotations

import pytest

from microbatch.cli._on_ray import ray_plan
from microbatch.cli._options import parse
from microbatch.ray import ReplicaSettings, deployment_options, recipe_for

from . import models

TARGET = "tests.ray.models:service"


def test_the_http_timeouts_live_in_every_replicas_app() -> None:
    plan = ray_plan(
        parse(["serve", TARGET, "--ray", "--body-timeout-s", "3", "--timeout-ms", "1500"])
    )
    assert plan.http.body_timeout_s == 3.0
    assert plan.http.default_timeout_s == 1.5


def test_the_graceful_timeout_is_each_replicas_graceful_shutdown() -> None:
    plan = ray_plan(parse(["serve", TARGET, "--ray", "--graceful-timeout-s", "7"]))
    assert plan.replicas.graceful_shutdown_timeout_s == 7.0
    options = deployment_options(recipe_for(models.service), plan.replicas)
    assert options["graceful_shutdown_timeout_s"] == 7.0
    # not given: the service's own grace period plus a margin, as before
    default = ray_plan(parse(["serve", TARGET, "--ray"]))
    assert default.replicas.graceful_shutdown_timeout_s is None
    assert (
        deployment_options(recipe_for(models.service), default.replicas)[
            "graceful_shutdown_timeout_s"
        ]
        == models.service.grace_s + 10.0
    )


def test_the_ray_settings_reach_the_replicas_and_the_cluster() -> None:
    plan = ray_plan(
        parse(
            [
                "serve",
                TARGET,
                "--ray",
                "--replicas",
                "3",
                "--replica-cpus",
                "0.5",
                "--replica-stages",
                "process",
                "--ray-address",
                "auto",
                "--port",
                "0",
            ]
        )
    )
    assert plan.replicas == ReplicaSettings(num_replicas=3, num_cpus=0.5, stage_mode="process")
    assert (plan.cluster.address, plan.cluster.port) == ("auto", 0)


def test_a_bad_graceful_timeout_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="graceful_shutdown_timeout_s must be a finite number > 0"):
        ReplicaSettings(graceful_shutdown_timeout_s=0)
