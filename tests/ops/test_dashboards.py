"""Issue 19, monitoring: every metric the Grafana dashboard and the Prometheus
alerting rules use exists in a real server's ``/metrics``; both files are well formed."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
import yaml

from .server import ROOT, logged_server

DASHBOARD = ROOT / "deploy" / "grafana" / "microbatch.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
METRIC = re.compile(r"\b((?:microbatch|process|python)_[a-z0-9_]+)\b")


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def alert_rules() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The sample names of a real server's /metrics after it served a request."""
    with logged_server(tmp_path_factory.mktemp("metrics"), "tests.http.models:service") as server:
        assert httpx.post(f"{server.url}/predict", json={"x": 1}).status_code == 200
        text = httpx.get(f"{server.url}/metrics").text
    return {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"
    }


def test_every_metric_of_the_dashboard_exists(exported: set[str]) -> None:
    used = {name for expr in dashboard_expressions() for name in METRIC.findall(expr)}
    assert len(used) >= 10
    assert used <= exported, sorted(used - exported)


def test_every_metric_of_the_alerts_exists(exported: set[str]) -> None:
    used = {name for rule in alert_rules() for name in METRIC.findall(rule["expr"])}
    assert {
        "microbatch_http_requests_total",
        "microbatch_items_dropped_total",
        "microbatch_worker_restarts_total",
        "microbatch_ready",
    } <= used  # overload, deadline misses, restarts, readiness
    assert used <= exported, sorted(used - exported)


def test_the_alerts_are_well_formed_rules() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(set(names)) == len(names)
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
        assert rule["expr"].count("{") == rule["expr"].count("}"), rule["alert"]
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert config["rule_files"] == [ALERTS.name]


def test_the_dashboard_is_a_grafana_dashboard_with_distinct_tidy_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "microbatch" and dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    for panel in dashboard["panels"]:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24 and panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")"), panel["title"]
            assert set(re.findall(r"\$(\w+)", expr)) <= variables | {"__rate_interval"}
