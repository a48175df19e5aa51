"""The command line's one options table: every ``serve`` flag works in every mode it
claims, and is refused, naming the flag and the mode, in every other."""

from __future__ import annotations

from pathlib import Path

import pytest

from microbatch.cli._options import COMMANDS, MODES, Mode, Option, build_parser, parse, serve_mode
from microbatch.cli._serving import http_config, serve_settings

SERVE = COMMANDS["serve"]
TARGET = "tests.http.models:double"
MODE_FLAGS: dict[Mode, list[str]] = {"plain": [], "workers": ["--workers", "2"], "ray": ["--ray"]}
MODE_NAMES = {"plain": "serve", "workers": "serve --workers N", "ray": "serve --ray"}


def sample_value(option: Option) -> list[str]:
    """The option as given on a command line, with a value it accepts."""
    if option.action == "store_true":
        return [option.name]
    if option.choices:
        return [option.name, option.choices[-1]]
    if option.dest == "config":
        return [option.name, str(Path(__file__).with_name("empty.toml"))]
    if option.dest == "stage":
        return [option.name, "Double.max_batch_size=4"]
    if option.dest == "ray_address":
        return [option.name, "127.0.0.1:6379"]
    if option.type is None:
        return [option.name, "some-text"]
    return [option.name, "2"]


def flag_cases() -> list[tuple[Option, Mode]]:
    return [
        (option, mode)
        for option in SERVE.options
        if not option.positional and option.dest not in ("ray", "workers")
        for mode in MODES
    ]


@pytest.mark.parametrize(("option", "mode"), flag_cases(), ids=lambda case: str(case))
def test_every_serve_flag_works_or_is_refused_in_every_mode(
    option: Option, mode: Mode, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", TARGET, *MODE_FLAGS[mode], *sample_value(option)]
    if mode in option.modes:
        parsed = parse(argv)
        assert serve_mode(parsed.values) == mode
        assert option.dest in parsed.given
        return
    with pytest.raises(SystemExit) as stopped:
        parse(argv)
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert f"{option.name} does not work with {MODE_NAMES[mode]}" in message
    assert option.refused and option.refused in message


def test_every_option_says_why_where_it_is_refused() -> None:
    for option in SERVE.options:
        assert (option.modes == frozenset(MODES)) == (not option.refused), option.name


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--ray", "--header-timeout-s", "5"], "--header-timeout-s does not work with serve --ray"),
        (["--ray", "--workers", "2"], "--workers does not work with serve --ray"),
        (["--ray", "--workers", "1"], "--workers does not work with serve --ray"),
        (["--replicas", "2"], "--replicas does not work with serve: "),
        (
            ["--workers", "3", "--replica-gpus", "1"],
            "--replica-gpus does not work with serve --workers N",
        ),
    ],
)
def test_flags_ray_cannot_honour_are_refused_not_ignored(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse(["serve", TARGET, *argv])
    assert stopped.value.code == 2
    assert named in capsys.readouterr().err


def test_the_http_settings_reach_the_app_and_the_server_in_every_mode() -> None:
    for mode in ("plain", "workers"):
        timeouts = ["--body-timeout-s", "3", "--timeout-ms", "1500", "--header-timeout-s", "4"]
        more = ["--graceful-timeout-s", "6", "--max-body-bytes", "99"]
        parsed = parse(["serve", TARGET, *MODE_FLAGS[mode], *timeouts, *more])
        config = http_config(parsed)
        assert (config.body_timeout_s, config.default_timeout_s) == (3.0, 1.5)
        assert config.max_body_bytes == 99
        settings = serve_settings(parsed)
        assert (settings.header_timeout_s, settings.graceful_timeout_s) == (4.0, 6.0)


def test_the_environment_fills_what_was_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MICROBATCH_AUTH_TOKEN", "from-env")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a Ray setting, in a plain serve
    plain = parse(["serve", TARGET])
    assert http_config(plain).auth_token == "from-env"
    assert parse(["serve", TARGET, "--auth-token", "given"]).auth_token == "given"
    assert parse(["serve", TARGET, "--ray"]).ray_address == "10.0.0.1:6379"
    assert parse(["bench", "http://127.0.0.1:1"]).auth_token == "from-env"


def test_defaults_fill_what_was_neither_given_nor_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MICROBATCH_AUTH_TOKEN", raising=False)
    parsed = parse(["serve", TARGET])
    assert parsed.given == frozenset({"target"})
    assert (parsed.port, parsed.workers, parsed.ray, parsed.auth_token) == (8000, 1, False, None)
    assert parse(["bench", "http://x", "-H", "A: b", "-H", "C: d"]).header == ["A: b", "C: d"]
    assert parse(["demo"]).callers == 256


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", TARGET, "--workers", "0"],
        ["serve", TARGET, "--timeout-ms", "-1"],
        ["serve", TARGET, "--body-timeout-s", "nan"],
        ["bench", "http://x", "--body", "1", "--body-file", "f"],
        ["bench", "http://x", "-c", "1,x"],
    ],
)
def test_bad_values_are_refused_by_the_parser(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse(argv)
    assert stopped.value.code == 2


def test_serve_help_shows_where_each_option_works(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    assert "where each option works" in text
    assert "only with serve --ray" in text
    table = text.split("where each option works")[1]
    row = next(line for line in table.splitlines() if line.strip().startswith("--header-timeout"))
    assert row.split()[1:] == ["yes", "yes", "no"]
