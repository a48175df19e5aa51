"""The argparse parser of a table of commands: one sub-parser per command, each option
added with no default of its own (an option left out is absent from the namespace),
its help text completed with its default, its environment variable and, for
``serve``, the modes it works in."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from .. import __version__
from ._config import env_names
from ._option import EVERY_MODE, MODE_NAMES, MODES, Command, Option

__all__ = ["modes_table", "parsers"]

_SERVE = "serve"  # the command whose options work in some modes only


def parsers(
    commands: Iterable[Command],
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``microbatch`` parser and each command's own, by the command's name."""
    parser = argparse.ArgumentParser(prog="microbatch", description="Dynamic batching for models.")
    parser.add_argument("--version", action="version", version=f"microbatch {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    subs: dict[str, argparse.ArgumentParser] = {}
    for command in commands:
        subs[command.name] = sub = subparsers.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
            epilog=modes_table(command) if command.name == _SERVE else None,
            formatter_class=(
                argparse.RawDescriptionHelpFormatter  # the table keeps its lines
                if command.name == _SERVE
                else argparse.HelpFormatter
            ),
        )
        groups: dict[str, Any] = {}
        for option in command.options:
            target: Any = sub
            if option.exclusive is not None:
                if option.exclusive not in groups:
                    groups[option.exclusive] = sub.add_mutually_exclusive_group()
                target = groups[option.exclusive]
            target.add_argument(*option.flags, **_argparse_keywords(command, option))
    return parser, subs


def modes_table(command: Command) -> str:
    """A command's options by mode, as plain text (``serve``'s ``--help`` epilog)."""
    shown = [option for option in command.options if not option.positional and option.dest != "ray"]
    width = max(len(option.name) for option in shown)
    lines = [
        "where each option works:",
        f"  {'':{width}}  {'serve':>5}  {'--workers N':>11}  {'--ray':>5}",
    ]
    for option in shown:
        marks = ["yes" if mode in option.modes else "no" for mode in MODES]
        lines.append(f"  {option.name:{width}}  {marks[0]:>5}  {marks[1]:>11}  {marks[2]:>5}")
    return "\n".join(lines)


def _argparse_keywords(command: Command, option: Option) -> dict[str, Any]:
    keywords: dict[str, Any] = {"help": _help(command, option)}
    if option.positional:
        keywords["metavar"] = option.metavar
        if option.nargs is not None:
            keywords["nargs"] = option.nargs
            keywords["default"] = argparse.SUPPRESS
        return keywords
    keywords["default"] = argparse.SUPPRESS
    keywords["dest"] = option.dest
    if option.action is not None:
        keywords["action"] = option.action
    if option.type is not None:
        keywords["type"] = option.type
    if option.choices is not None:
        keywords["choices"] = option.choices
    if option.metavar is not None:
        keywords["metavar"] = option.metavar
    return keywords


def _help(command: Command, option: Option) -> str:
    text = option.help
    if not (option.default is None or option.action == "store_true" or option.default == ()):
        text += f" (default {option.default})"
    serve = command.name == _SERVE
    names = env_names(option) if serve and not option.positional else ()
    if names or option.env is not None:
        text += f"; env {' or '.join(names or (option.env or '',))}"
    if serve and option.modes != EVERY_MODE:
        text += "; only with " + " or ".join(MODE_NAMES[m] for m in MODES if m in option.modes)
    return text.replace("%", "%%")
