"""The public surface of ``microbatch.http`` and its argument checks."""

from __future__ import annotations

import pytest

import microbatch.http
from microbatch.http import HttpConfig, app

from . import models


def test_the_public_api_is_pinned() -> None:
    assert sorted(microbatch.http.__all__) == [
        "CompletionModel",
        "EmbeddingModel",
        "HttpApp",
        "HttpConfig",
        "Services",
        "app",
    ]


def test_app_refuses_what_it_cannot_serve() -> None:
    with pytest.raises(TypeError, match=r"Service or a @microbatch\.batch function"):
        app(lambda xs: xs)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"max_body_bytes": 0}, "max_body_bytes"),
        ({"default_timeout_s": 0}, "default_timeout_s"),
        ({"body_timeout_s": float("inf")}, "body_timeout_s"),
        ({"auth_token": ""}, "auth_token"),
    ],
)
def test_settings_out_of_range_are_refused_by_name(settings: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        HttpConfig(**settings)  # type: ignore[arg-type]


def test_the_item_types_come_from_the_type_hints() -> None:
    served = app(models.service)
    assert (served.servable.input_type, served.servable.output_type) == (
        models.Point,
        models.Doubled,
    )
    untyped = app(models.untyped)
    assert (
        untyped.openapi["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"][
            "schema"
        ]
        == {}
    )
