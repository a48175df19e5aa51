"""Issue 19, configuration: every ``serve`` setting from a flag, the environment
(``MICROBATCH_<FLAG>``) or a TOML file (``--config``), by one rule: flag >
environment > file > code; stages' batching settings the same way."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import microbatch
from microbatch.cli._config import ConfigError, apply_stage_settings, stage_settings
from microbatch.cli._options import COMMANDS, parse
from microbatch.cli._serving import http_config, serve_settings
from microbatch.http import HttpApp
from tests.http import models

from .server import logged_server

TARGET = "tests.http.models:service"
SOURCES = ("flag", "env", "file")

# option: (flag, its value given as flag/env text, as the file writes it, the value parsed)
CASES: dict[str, dict[str, tuple[Any, Any, Any]]] = {
    # source: (command-line text / env text, TOML value, parsed value)
    "port": {"flag": ("1001", 1001, 1001), "env": ("1002", 1002, 1002), "file": ("", 1003, 1003)},
    "drain_delay_s": {
        "flag": ("1.5", 1.5, 1.5),
        "env": ("2.5", 2.5, 2.5),
        "file": ("", 3.5, 3.5),
    },
    "log_format": {
        "flag": ("json", "json", "json"),
        "env": ("text", "text", "text"),
        "file": ("", "json", "json"),
    },
    "api_title": {"flag": ("A", "A", "A"), "env": ("B", "B", "B"), "file": ("", "C", "C")},
}
DEFAULTS = {"port": 8000, "drain_delay_s": 0.0, "log_format": "text", "api_title": None}


def subsets() -> list[tuple[str, ...]]:
    return [c for n in range(len(SOURCES) + 1) for c in itertools.combinations(SOURCES, n)]


@pytest.mark.parametrize("dest", sorted(CASES))
@pytest.mark.parametrize("present", subsets(), ids=lambda p: "+".join(p) or "none")
def test_flag_beats_environment_beats_file_beats_code(
    dest: str, present: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = CASES[dest]
    argv = ["serve", TARGET]
    monkeypatch.delenv(f"MICROBATCH_{dest.upper()}", raising=False)
    if "flag" in present:
        argv += ["--" + dest.replace("_", "-"), values["flag"][0]]
    if "env" in present:
        monkeypatch.setenv(f"MICROBATCH_{dest.upper()}", values["env"][0])
    if "file" in present:
        config = tmp_path / "settings.toml"
        value = values["file"][1]
        config.write_text(f"{dest} = {value!r}\n".replace("'", '"'))
        argv += ["--config", str(config)]
    parsed = parse(argv)
    winner = next((source for source in SOURCES if source in present), None)
    expected = DEFAULTS[dest] if winner is None else values[winner][2]
    assert parsed.values[dest] == expected
    assert (dest in parsed.given) == (winner is not None)


def test_every_serve_setting_has_its_environment_variable_in_the_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse(["serve", "--help"])
    help_text = capsys.readouterr().out
    for option in COMMANDS["serve"].options:
        if not option.positional:
            assert f"MICROBATCH_{option.dest.upper()}" in help_text, option.name


def test_environment_values_are_converted_and_checked_as_flags_are(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MICROBATCH_ACCESS_LOG", "yes")
    monkeypatch.setenv("MICROBATCH_WORKERS", "3")
    monkeypatch.setenv("MICROBATCH_HOST", "0.0.0.0")
    parsed = parse(["serve", TARGET])
    assert parsed.access_log is True and parsed.workers == 3 and parsed.host == "0.0.0.0"
    monkeypatch.setenv("MICROBATCH_PORT", "eighty")
    with pytest.raises(SystemExit) as stopped:
        parse(["serve", TARGET])
    assert stopped.value.code == 2
    assert "MICROBATCH_PORT" in capsys.readouterr().err


def test_the_legacy_ray_address_variable_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MICROBATCH_RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert parse(["serve", TARGET, "--ray"]).ray_address == "10.0.0.1:6379"
    monkeypatch.setenv("MICROBATCH_RAY_ADDRESS", "10.0.0.2:6379")
    assert parse(["serve", TARGET, "--ray"]).ray_address == "10.0.0.2:6379"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour = 'red'\n", "unknown setting 'colour'"),
        ("port = [\n", "not valid TOML"),
        ("access_log = 'sometimes'\n", "access_log must be true or false"),
        ("log_format = 'xml'\n", "log_format must be one of text, json"),
        ("port = true\n", "port must be a string or a number"),
        ("[stages.Double]\nmax_batch_size = 0\n", "Double.max_batch_size"),
        ("[stages.Double]\nbatch = 4\n", "unknown stage setting 'batch'"),
    ],
)
def test_a_bad_file_is_a_clear_error_naming_it(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text)
    with pytest.raises(SystemExit) as stopped:
        parse(["serve", TARGET, "--config", str(config)])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert message in error and "bad.toml" in error


def test_a_missing_file_named_in_the_environment_is_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MICROBATCH_CONFIG", "/nowhere/microbatch.toml")
    with pytest.raises(SystemExit):
        parse(["serve", TARGET])
    assert "/nowhere/microbatch.toml" in capsys.readouterr().err


def test_file_keys_may_use_dashes_and_feed_every_part(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text(
        'host = "0.0.0.0"\n'
        "graceful-timeout-s = 12\n"
        "drain_delay_s = 5\n"
        "access_log = true\n"
        'auth_token = "s3cret"\n'
        'api_title = "Embeddings"\n'
        'api_version = "2.1.0"\n'
        "timeout_ms = 250\n"
    )
    parsed = parse(["serve", TARGET, "--config", str(config)])
    http, settings = http_config(parsed), serve_settings(parsed)
    assert (settings.host, settings.graceful_timeout_s, settings.drain_delay_s) == (
        "0.0.0.0",
        12.0,
        5.0,
    )
    assert http.access_log and http.auth_token == "s3cret" and http.default_timeout_s == 0.25
    info = HttpApp(models.double, http).openapi["info"]
    assert (info["title"], info["version"]) == ("Embeddings", "2.1.0")


# -- stages ------------------------------------------------------------------------------


def test_stage_settings_follow_the_same_rule_setting_by_setting() -> None:
    merged = stage_settings(
        ["Double.max_batch_size=64"],
        "Double.max_batch_size=32 Double.max_latency_ms=2.5,Other.workers=2",
        {"Double": {"max_batch_size": 16, "max_queue": 100, "isolate_errors": False}},
        "f.toml",
    )
    assert merged == {
        "Double": {
            "max_batch_size": 64,  # flag
            "max_latency_ms": 2.5,  # environment
            "max_queue": 100,  # file
            "isolate_errors": False,
        },
        "Other": {"workers": 2},
    }


@pytest.mark.parametrize(
    "text", ["Double", "Double.max_batch_size", "max_batch_size=3", "Double.workers=zero"]
)
def test_a_malformed_stage_setting_is_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        stage_settings([text], None, {})


def test_stage_settings_make_a_new_service_and_leave_the_code_as_it_was() -> None:
    original = models.service
    changed = apply_stage_settings(
        original, {"Double": {"max_batch_size": 4, "max_latency_ms": 1.0, "workers": 2}}
    )
    assert isinstance(changed, microbatch.Service) and changed is not original
    (stage,) = changed.stages
    assert (stage.config.max_batch_size, stage.config.max_latency_ms, stage.workers) == (4, 1.0, 2)
    assert original.stages[0].config.max_batch_size == 32  # what the code says
    assert changed.examples == original.examples and changed.name == original.name
    assert apply_stage_settings(original, {}) is original


def test_stage_settings_name_a_stage_of_a_service() -> None:
    with pytest.raises(ConfigError, match=r"no stage named 'Nope'.*stages: Double"):
        apply_stage_settings(models.service, {"Nope": {"workers": 2}})
    with pytest.raises(ConfigError, match=r"@microbatch\.batch function"):
        apply_stage_settings(models.double, {"double": {"max_batch_size": 2}})


def test_a_real_server_takes_its_settings_from_a_file_and_the_environment(
    tmp_path: Path,
) -> None:
    config = tmp_path / "microbatch.toml"
    config.write_text(
        'api_title = "From the file"\napi_version = "9.9.9"\n[stages.Double]\nmax_batch_size = 3\n'
    )
    env = {"MICROBATCH_CONFIG": str(config), "MICROBATCH_API_VERSION": "from-env"}
    with logged_server(tmp_path, TARGET, env=env) as server:
        info = httpx.get(f"{server.url}/openapi.json").json()["info"]
        replies = [httpx.post(f"{server.url}/predict", json={"x": x}) for x in range(3)]
    assert info == {**info, "title": "From the file", "version": "from-env"}
    assert [r.status_code for r in replies] == [200, 200, 200]


def test_a_stage_the_service_lacks_is_a_clear_exit(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "microbatch", "serve", TARGET, "--stage", "Nope.workers=2"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "src:."},
    )
    assert done.returncode == 2
    assert "no stage named 'Nope'" in done.stderr
