"""Settings, recipes and deployment options, without a Ray cluster."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from ray import cloudpickle

import microbatch
from microbatch import BatchConfig, Service, Stage
from microbatch.http.asgi import Message, Scope
from microbatch.ray import (
    FunctionRecipe,
    ReplicaSettings,
    ServiceRecipe,
    deployment_options,
    recipe_for,
)
from microbatch.ray.replica import UnderRoutePrefix

from . import models


def test_default_is_one_replica_with_one_cpu_and_stages_in_threads() -> None:
    settings = ReplicaSettings()
    assert settings.scaling(items_per_replica=64) == {"num_replicas": 1}
    assert settings.actor_options() == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert settings.stage_mode == "thread"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"num_replicas": 2, "autoscaling": {"max_replicas": 4}}, "not both"),
        ({"num_replicas": 0}, "num_replicas must be an int >= 1, got 0"),
        ({"num_replicas": 1.5}, "num_replicas must be an int >= 1, got 1.5"),
        ({"num_cpus": -1}, "num_cpus must be a finite number >= 0, got -1"),
        ({"num_gpus": float("inf")}, "num_gpus must be a finite number >= 0, got inf"),
        ({"max_ongoing_requests": 0}, "max_ongoing_requests must be an int >= 1, got 0"),
        ({"stage_mode": "fork"}, "stage_mode must be 'thread' or 'process', got 'fork'"),
        ({"ray_actor_options": {"num_gpus": 1}}, "set num_gpus with ReplicaSettings"),
        ({"autoscaling": [1, 4]}, "autoscaling must be a mapping"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ReplicaSettings(**settings)


def test_fractional_gpus_and_more_actor_options_reach_the_replicas() -> None:
    settings = ReplicaSettings(
        num_replicas=3, num_cpus=0.5, num_gpus=0.25, ray_actor_options={"memory": 2**30}
    )
    assert settings.scaling(64) == {"num_replicas": 3}
    assert settings.actor_options() == {"memory": 2**30, "num_cpus": 0.5, "num_gpus": 0.25}


def test_autoscaling_targets_a_full_batch_per_slot_unless_told_otherwise() -> None:
    settings = ReplicaSettings(autoscaling={"min_replicas": 1, "max_replicas": 4})
    assert settings.scaling(items_per_replica=128) == {
        "autoscaling_config": {
            "min_replicas": 1,
            "max_replicas": 4,
            "target_ongoing_requests": 128,
        }
    }
    told = ReplicaSettings(autoscaling={"max_replicas": 4, "target_ongoing_requests": 10})
    assert told.scaling(128)["autoscaling_config"]["target_ongoing_requests"] == 10


def test_a_service_recipe_builds_fresh_services_with_stages_in_threads() -> None:
    service = Service(
        Stage(models.Double, workers=2, max_batch_size=16),
        Stage(models.Double, name="again", max_batch_size=48, env={"X": "1"}),
        examples=[models.Point(1.0)],
        max_in_flight=500,
        grace_s=3.0,
    )
    recipe = recipe_for(service)
    assert isinstance(recipe, ServiceRecipe)
    assert (recipe.name, recipe.bound, recipe.items_per_replica) == ("again", 500, 48)
    in_threads = recipe.build("thread")
    assert in_threads is not service
    assert [s.mode for s in in_threads.stages] == ["thread", "thread"]
    assert in_threads.stages[1].env == {}
    assert [s.config.max_batch_size for s in in_threads.stages] == [16, 48]
    assert (in_threads.examples, in_threads.max_in_flight, in_threads.grace_s) == (
        [models.Point(1.0)],
        500,
        3.0,
    )
    as_defined = recipe.build("process")
    assert [s.mode for s in as_defined.stages] == ["process", "process"]
    assert as_defined.stages[1].env == {"X": "1"}


def test_dropping_a_stages_process_placement_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    recipe = recipe_for(Service(Stage(models.Double, cpus=[0])))
    with caplog.at_level(logging.WARNING, logger="microbatch.ray"):
        recipe.build("thread")
    assert "env and cpus apply to worker processes" in caplog.text


async def test_a_function_recipe_builds_a_fresh_batched_function() -> None:
    recipe = recipe_for(models.triple)
    assert isinstance(recipe, FunctionRecipe)
    assert recipe.name == "triple"
    assert (recipe.bound, recipe.items_per_replica) == (4096 + 16, 16)
    function = recipe.build("thread")
    assert isinstance(function, microbatch.AsyncBatchedFunction)
    assert function is not models.triple
    assert function.config == models.triple.config
    assert await function(5) == 15
    await function.close()


def test_a_plain_batched_function_stays_plain() -> None:
    @microbatch.batch(max_batch_size=4)
    def double(xs: list[int]) -> list[int]:
        return [2 * x for x in xs]

    function = recipe_for(double).build("thread")
    assert isinstance(function, microbatch.SyncBatchedFunction)
    assert function(21) == 42
    function.close()


async def test_recipes_travel_the_way_ray_sends_them() -> None:
    service = cloudpickle.loads(cloudpickle.dumps(recipe_for(models.service)))
    assert service == recipe_for(models.service)
    function = cloudpickle.loads(cloudpickle.dumps(recipe_for(models.triple))).build("thread")
    assert await function(2) == 6
    await function.close()


def test_only_services_and_batched_functions_deploy() -> None:
    with pytest.raises(TypeError, match=r"expected a microbatch\.Service"):
        recipe_for(lambda xs: xs)


def test_deployment_options_keep_batches_uncapped_and_outlast_the_services_grace() -> None:
    recipe = recipe_for(Service(Stage(models.Double), max_in_flight=300, grace_s=5.0))
    options = deployment_options(recipe, ReplicaSettings(num_replicas=2, num_gpus=0.5))
    assert options == {
        "name": "Double",
        "max_ongoing_requests": 300 + 64,
        "ray_actor_options": {"num_cpus": 1.0, "num_gpus": 0.5},
        "num_replicas": 2,
        "graceful_shutdown_timeout_s": 15.0,
    }
    function = recipe_for(microbatch.batch(max_queue=10)(models.triple.__wrapped__))
    told = deployment_options(function, ReplicaSettings(max_ongoing_requests=7), name="x")
    assert (told["name"], told["max_ongoing_requests"]) == ("x", 7)
    assert "graceful_shutdown_timeout_s" not in told
    assert deployment_options(function, ReplicaSettings())["max_ongoing_requests"] == 10 + 2 * 64


@pytest.mark.parametrize(
    ("root_path", "path", "seen"),
    [
        ("/fn", "/fn/predict", "/predict"),
        ("/fn", "/fn", "/"),
        ("/fn/", "/fn/health/ready", "/health/ready"),
        ("/fn", "/fnord/predict", "/fnord/predict"),
        ("/", "/predict", "/predict"),
        ("", "/predict", "/predict"),
    ],
)
async def test_routes_are_relative_to_the_route_prefix(
    root_path: str, path: str, seen: str
) -> None:
    paths: list[str] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        paths.append(scope["path"])

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        pass

    scope = {"type": "http", "path": path, "root_path": root_path}
    await UnderRoutePrefix(app)(scope, receive, send)  # type: ignore[arg-type]
    assert paths == [seen]
    assert scope["path"] == path  # the server's scope is left as it was


def test_stages_settings_survive_the_trip() -> None:
    config = BatchConfig(max_batch_size=8, max_latency_ms=3, policy="fixed")
    recipe = recipe_for(Service(Stage(models.Double, batching=config)))
    (stage,) = recipe.build("thread").stages
    assert stage.batching == config


def test_a_replica_serves_the_services_name_and_openai_routes() -> None:
    from examples.generate import make_service
    from microbatch.http import CompletionModel, EmbeddingModel
    from microbatch.http.openai_routes import openai_routes

    service = make_service(train_s=0.1)
    service.embedding_model = EmbeddingModel()  # type: ignore[attr-defined]
    recipe = recipe_for(service)
    assert recipe.name == "generate"
    copy = cloudpickle.loads(cloudpickle.dumps(recipe)).build("thread")
    assert copy.name == "generate"
    assert isinstance(copy.completion_model, CompletionModel)  # type: ignore[attr-defined]
    assert copy.embedding_model == EmbeddingModel()  # type: ignore[attr-defined]
    routes = openai_routes(microbatch.http.HttpApp(copy), {copy.name: copy})
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models"} <= set(routes)
