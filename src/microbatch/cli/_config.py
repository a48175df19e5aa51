"""Settings of ``microbatch serve`` from the environment and from a TOML file.

One rule, for every setting: **flag > environment > file > code**. A flag given on
the command line wins; else the environment variable ``MICROBATCH_<FLAG>`` (e.g.
``MICROBATCH_DRAIN_DELAY_S``); else the key of the file named by ``--config`` (or
``MICROBATCH_CONFIG``), spelled as the flag without its dashes (``drain_delay_s``
or ``drain-delay-s``); else the default of the options table, or for a stage's
batching settings, what the code says.

A stage's batching settings are ``NAME.SETTING=VALUE``: ``--stage`` (repeatable),
``MICROBATCH_STAGE`` (several, separated by spaces or commas), or a table
``[stages.NAME]`` of the file; each setting follows the same rule on its own.

This module knows options only by the :class:`OptionLike` protocol, so that the
options table (:mod:`._options`) builds on it without an import cycle.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..pipeline.service import Service

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "STAGE_ENV",
    "STAGE_SETTINGS",
    "ConfigError",
    "ConfigFile",
    "OptionLike",
    "StageSettings",
    "apply_stage_settings",
    "env_names",
    "from_file",
    "from_text",
    "read_config_file",
    "stage_settings",
]

ENV_PREFIX = "MICROBATCH_"
CONFIG_ENV = "MICROBATCH_CONFIG"
STAGE_ENV = "MICROBATCH_STAGE"

StageSettings = Mapping[str, Mapping[str, Any]]
"""Per stage name: its batching settings by name."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class ConfigError(ValueError):
    """A setting from the environment or a file is wrong; the message names where it
    came from, the setting and the value."""


class OptionLike(Protocol):
    """What this module needs to know of an option of the table."""

    @property
    def dest(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def type(self) -> Callable[[str], Any] | None: ...
    @property
    def action(self) -> str | None: ...
    @property
    def choices(self) -> tuple[str, ...] | None: ...
    @property
    def env(self) -> str | None: ...


def env_names(option: OptionLike) -> tuple[str, ...]:
    """The environment variables of a ``serve`` option, first found wins:
    ``MICROBATCH_<FLAG>``, then the table's own (``RAY_ADDRESS``), if another."""
    derived = ENV_PREFIX + option.dest.upper()
    own = option.env
    return (derived,) if own is None or own == derived else (derived, own)


@dataclass(frozen=True)
class ConfigFile:
    """A TOML settings file, read.

    Attributes:
        path: Where it was read from.
        values: Option values by the option's ``dest`` (as written in the file).
        stages: The ``[stages.NAME]`` tables.
    """

    path: str
    values: Mapping[str, Any] = field(default_factory=dict)
    stages: StageSettings = field(default_factory=dict)


def read_config_file(path: str, known: Collection[str]) -> ConfigFile:
    """Read the TOML file at ``path``; its keys must be among ``known`` (the options'
    ``dest``, dashes allowed for underscores), or ``stages``.

    Raises:
        ConfigError: It cannot be read, is not TOML, or has an unknown key.
    """
    try:
        with Path(path).open("rb") as file:
            document = tomllib.load(file)
    except OSError as error:
        raise ConfigError(f"--config {path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config {path}: not valid TOML: {error}") from None
    values: dict[str, Any] = {}
    stages: dict[str, dict[str, Any]] = {}
    for key, value in document.items():
        dest = key.replace("-", "_")
        if dest == "stages":
            if not isinstance(value, dict) or not all(isinstance(t, dict) for t in value.values()):
                raise ConfigError(f"{path}: [stages.NAME] must be tables of settings")
            stages = {name: dict(table) for name, table in value.items()}
        elif dest in known:
            values[dest] = value
        else:
            raise ConfigError(
                f"{path}: unknown setting {key!r} (known: {', '.join(sorted(known))}, stages)"
            )
    return ConfigFile(path, values, stages)


def from_text(option: OptionLike, text: str, source: str) -> Any:
    """The value of ``option`` written as ``text`` (in the environment variable
    ``source``), converted and checked as on the command line.

    Raises:
        ConfigError: It is not a value the option takes.
    """
    if option.action == "store_true":
        word = text.strip().lower()
        if word not in _TRUE | _FALSE:
            raise ConfigError(f"{source}: expected true or false, got {text!r}")
        return word in _TRUE
    if option.action == "append":
        return [part for part in re.split(r"[,\s]+", text) if part]
    return _converted(option, text, source)


def from_file(option: OptionLike, value: Any, source: str) -> Any:
    """The value of ``option`` as a TOML file gives it, converted and checked as on
    the command line.

    Raises:
        ConfigError: It is not a value the option takes.
    """
    if option.action == "store_true":
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {_key(option)} must be true or false, got {value!r}")
        return value
    if option.action == "append":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise ConfigError(f"{source}: {_key(option)} must be a list of strings")
        return list(items)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"{source}: {_key(option)} must be a string or a number, got {value!r}")
    if option.type is None and not isinstance(value, str):
        raise ConfigError(f"{source}: {_key(option)} must be a string, got {value!r}")
    return _converted(option, str(value), source)


def _converted(option: OptionLike, text: str, source: str) -> Any:
    try:
        value = text if option.type is None else option.type(text)
    except argparse.ArgumentTypeError as error:
        raise ConfigError(f"{source}: {_key(option)}: {error}") from None
    except (ValueError, TypeError):  # int, float: as argparse words it
        kind = getattr(option.type, "__name__", "")
        raise ConfigError(f"{source}: {_key(option)}: invalid {kind} value: {text!r}") from None
    if option.choices is not None and value not in option.choices:
        raise ConfigError(
            f"{source}: {_key(option)} must be one of {', '.join(option.choices)}, got {text!r}"
        )
    return value


def _key(option: OptionLike) -> str:
    return option.dest


# -- a stage's batching settings ----------------------------------------------------


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected an integer >= 1, got {value!r}")
    return value


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"expected a number > 0, got {value!r}")
    return float(value)


def _non_negative_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"expected a number >= 0, got {value!r}")
    return float(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


STAGE_SETTINGS: Mapping[str, Callable[[Any], Any]] = {
    "max_batch_size": _positive_int,
    "max_latency_ms": _non_negative_number,
    "max_queue": _positive_int,
    "timeout_s": _positive_number,
    "isolate_errors": _boolean,
    "workers": _positive_int,
}
"""The settings of a stage that configuration may change, and their checks."""


def stage_settings(
    flags: Sequence[str], env_text: str | None, file_stages: StageSettings, file_path: str = ""
) -> dict[str, dict[str, Any]]:
    """Each stage's settings: from the file, then the environment, then the flags
    (later wins, setting by setting).

    Raises:
        ConfigError: A setting is unknown, or its value wrong.
    """
    merged: dict[str, dict[str, Any]] = {}
    for name, table in file_stages.items():
        for setting, value in table.items():
            _put(merged, name, setting, value, f"{file_path} [stages.{name}]")
    for text in re.split(r"[,\s]+", env_text or ""):
        if text:
            _put(merged, *_parsed(text, STAGE_ENV), STAGE_ENV)
    for text in flags:
        _put(merged, *_parsed(text, "--stage"), "--stage")
    return merged


def _parsed(text: str, source: str) -> tuple[str, str, Any]:
    target, equals, raw = text.partition("=")
    name, dot, setting = target.rpartition(".")
    if not (equals and dot and name and setting):
        raise ConfigError(f"{source}: expected NAME.SETTING=VALUE, got {text!r}")
    return name, setting, _literal(raw)


def _literal(text: str) -> Any:
    """A value written on a command line: a bool, an int, a float, or else text."""
    word = text.strip().lower()
    if word in ("true", "false"):
        return word == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _put(
    merged: dict[str, dict[str, Any]], name: str, setting: str, value: Any, source: str
) -> None:
    check = STAGE_SETTINGS.get(setting)
    if check is None:
        raise ConfigError(
            f"{source}: unknown stage setting {setting!r} "
            f"(known: {', '.join(sorted(STAGE_SETTINGS))})"
        )
    try:
        merged.setdefault(name, {})[setting] = check(value)
    except ValueError as error:
        raise ConfigError(f"{source}: {name}.{setting}: {error}") from None


def apply_stage_settings(served: object, settings: StageSettings) -> object:
    """``served`` with its stages' settings changed (a new Service; ``served`` itself
    is left as it was), or ``served`` when there are none.

    Raises:
        ConfigError: ``served`` is not a Service, a stage is unknown, or the settings
            are out of range for it.
    """
    if not settings:
        return served
    if not isinstance(served, Service):
        raise ConfigError(
            "stage settings apply to a Service's stages; a @microbatch.batch function "
            "takes its settings in code"
        )
    names = [stage.name for stage in served.stages]
    unknown = sorted(set(settings) - set(names))
    if unknown:
        raise ConfigError(
            f"no stage named {', '.join(map(repr, unknown))} (stages: {', '.join(names)})"
        )
    stages = []
    for stage in served.stages:
        changes = dict(settings.get(stage.name, {}))
        if "workers" in changes and stage.max_concurrent_batches is not None:
            changes["max_concurrent_batches"] = None
        try:
            stages.append(dataclasses.replace(stage, **changes))
        except (TypeError, ValueError) as error:
            raise ConfigError(f"stage {stage.name!r}: {error}") from None
    return Service(
        *stages,
        examples=served.examples,
        max_in_flight=served.max_in_flight,
        grace_s=served.grace_s,
        name=served.name,
    )
