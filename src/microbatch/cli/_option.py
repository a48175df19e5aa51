"""What one option of the command line is: a flag with its help, default, type,
environment variable and, for ``serve``, the modes it works in; a command is a name,
its help and its options; and the argparse value types the options use."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "EVERY_MODE",
    "MODES",
    "MODE_NAMES",
    "Command",
    "Mode",
    "Option",
    "float_list",
    "int_list",
    "non_negative_float",
    "positive_float",
    "positive_int",
]

Mode = Literal["plain", "workers", "ray"]
MODES: tuple[Mode, ...] = ("plain", "workers", "ray")
"""``serve``'s modes: HTTP in the serving process, ``--workers N``, ``--ray``."""
EVERY_MODE = frozenset(MODES)
"""An option that works in every mode."""
MODE_NAMES: Mapping[Mode, str] = {
    "plain": "serve",
    "workers": "serve --workers N",
    "ray": "serve --ray",
}
"""How messages name each mode: its command line."""


def positive_int(text: str) -> int:
    """An integer >= 1 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """``1,16,64`` (argparse type)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected integers like 1,16,64, got {text!r}") from error


def float_list(text: str) -> tuple[float, ...]:
    """``100,500`` (argparse type)."""
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected numbers like 100,500, got {text!r}") from error


@dataclass(frozen=True, slots=True)
class Option:
    """One flag (or positional argument) of one command.

    Attributes:
        flags: ``("--port",)``, ``("-c", "--concurrency")``, or a positional's name.
        help: What it does (the mode notes are added to it).
        default: Its value when neither given nor in the environment.
        type: Converts the text given (argparse type).
        action: ``store_true`` or ``append``; None: one value.
        choices: The values allowed.
        metavar: Its value's name in the help.
        env: An environment variable read when the flag is not given.
        modes: ``serve`` only: the modes it works in.
        refused: ``serve`` only: why it does not work in the other modes.
        exclusive: Options of one command sharing this name exclude each other.
        nargs: A positional's ``"*"``: any number of values, absent when none.
    """

    flags: tuple[str, ...]
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    action: Literal["store_true", "append"] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    env: str | None = None
    modes: frozenset[Mode] = EVERY_MODE
    refused: str = ""
    exclusive: str | None = None
    nargs: Literal["*"] | None = None

    @property
    def dest(self) -> str:
        """The attribute it is parsed into."""
        name = next((flag for flag in self.flags if flag.startswith("--")), self.flags[0])
        return name.lstrip("-").replace("-", "_")

    @property
    def name(self) -> str:
        """How messages name it: its long flag."""
        return next((flag for flag in self.flags if flag.startswith("--")), self.flags[0])

    @property
    def positional(self) -> bool:
        """A positional argument (always given)."""
        return not self.flags[0].startswith("-")


@dataclass(frozen=True, slots=True)
class Command:
    """One sub-command: its help and its options."""

    name: str
    help: str
    options: tuple[Option, ...]
    description: str | None = None
