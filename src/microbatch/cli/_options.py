"""The command line's one options table: every flag of every command, where it works,
and the environment variable it falls back to.

``serve`` runs in three modes (``plain``: HTTP in the serving process; ``workers``:
``--workers N`` HTTP processes in front of one hub; ``ray``: ``--ray``, replicas behind
Ray Serve's proxy). Each of its flags names the modes it works in; given in any other
mode it is refused, with a message naming the flag, the mode, and why.

What an option is lives in :mod:`._option`; the parser is built from the table by
:mod:`._parser`, with no defaults of its own, so that what the user gave is told apart
from what was left out; :func:`parse` then fills in the environment and the defaults.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..http.app import HttpConfig
from ._config import (
    CONFIG_ENV,
    STAGE_ENV,
    ConfigError,
    ConfigFile,
    env_names,
    from_file,
    from_text,
    read_config_file,
    stage_settings,
)
from ._option import (
    MODE_NAMES,
    MODES,
    Command,
    Mode,
    Option,
    float_list,
    int_list,
    non_negative_float,
    positive_float,
    positive_int,
)
from ._parser import modes_table, parsers

__all__ = [
    "COMMANDS",
    "MODES",
    "Command",
    "Mode",
    "Option",
    "Parsed",
    "build_parser",
    "options_table",
    "parse",
    "serve_mode",
]

_TOKEN_ENV = "MICROBATCH_AUTH_TOKEN"
_NOT_RAY_HTTP = "Ray Serve's proxy speaks HTTP there, not microbatch's server"
_RAY_ONLY = "it sets up Ray Serve replicas; add --ray"

SERVE = Command(
    "serve",
    "serve a Service or @batch function over HTTP",
    (
        Option(("target",), "a Service or @batch function", metavar="MODULE:ATTR"),
        Option(
            ("more_targets",),
            "more services in the same server, each under /NAME/ (and /v2/models/NAME)",
            default=(),
            metavar="MODULE:ATTR",
            nargs="*",
            modes=frozenset({"plain"}),
            refused="one service per hub or deployment there",
        ),
        Option(("--host",), "address to bind (--ray: Ray's proxy)", default="127.0.0.1"),
        Option(("--port",), "port to bind; 0 picks a free one", default=8000, type=int),
        Option(
            ("--grpc-port",),
            "also serve the Open Inference Protocol v2 over gRPC on this port "
            "(0 picks a free one; needs microbatch[grpc])",
            type=int,
            modes=frozenset({"plain"}),
            refused="gRPC is served by the one serving process only",
        ),
        Option(
            ("--workers",),
            "HTTP processes in front of the one Service (1: HTTP in the serving process)",
            default=1,
            type=positive_int,
            modes=frozenset({"plain", "workers"}),
            refused="Ray's replicas are the processes there: use --replicas",
        ),
        Option(
            ("--auth-token",),
            "bearer token required on non-probe routes",
            env=_TOKEN_ENV,
        ),
        Option(
            ("--max-body-bytes",),
            "413 above it",
            default=HttpConfig.max_body_bytes,
            type=positive_int,
        ),
        Option(
            ("--timeout-ms",),
            "each request's deadline, HTTP and Ray handle callers alike (504 past it)",
            default=HttpConfig.default_timeout_s * 1000,
            type=positive_float,
        ),
        Option(
            ("--body-timeout-s",),
            "longest time to receive a request's body once its headers are in (then 408)",
            default=HttpConfig.body_timeout_s,
            type=positive_float,
        ),
        Option(
            ("--header-timeout-s",),
            "longest time to receive a request's headers (then 408 and close)",
            default=10.0,
            type=positive_float,
            modes=frozenset({"plain", "workers"}),
            refused=f"{_NOT_RAY_HTTP}, and it has no header deadline",
        ),
        Option(
            ("--max-header-bytes",),
            "most bytes of a request's line and headers (then 431 and close)",
            default=64 * 1024,
            type=positive_int,
            modes=frozenset({"plain", "workers"}),
            refused=f"{_NOT_RAY_HTTP}, and it has its own header limit",
        ),
        Option(
            ("--keep-alive-s",),
            "an idle kept-alive connection is closed after this long",
            default=5.0,
            type=positive_float,
            modes=frozenset({"plain", "workers"}),
            refused=f"{_NOT_RAY_HTTP}, and it keeps connections alive its own way",
        ),
        Option(
            ("--max-connections",),
            "open connections per HTTP process; one more is answered 503 and closed",
            default=4096,
            type=positive_int,
            modes=frozenset({"plain", "workers"}),
            refused=f"{_NOT_RAY_HTTP}, and it has its own connection limit",
        ),
        Option(
            ("--graceful-timeout-s",),
            "on SIGTERM, longest wait for in-flight requests "
            "(--ray: each replica's graceful shutdown timeout)",
            default=30.0,
            type=positive_float,
        ),
        Option(
            ("--log-level",),
            "how much to log (Ray Serve's logs too)",
            default="info",
            choices=("debug", "info", "warning", "error"),
        ),
        Option(
            ("--log-format",),
            "one format for every log line: text, or one JSON object per line",
            default="text",
            choices=("text", "json"),
            modes=frozenset({"plain", "workers"}),
            refused="Ray Serve formats its replicas' logs (RAY_SERVE_LOG_ENCODING=JSON)",
        ),
        Option(
            ("--access-log",),
            "log one line per request (method, path, status, duration, request id)",
            default=False,
            action="store_true",
        ),
        Option(
            ("--no-server-timing",),
            "leave out the Server-Timing header (queued, behind a running batch, model "
            "time and batch size per stage) of predict responses",
            default=False,
            action="store_true",
            modes=frozenset({"plain", "workers"}),
            refused="Ray Serve's proxy answers without Server-Timing",
        ),
        Option(
            ("--otel",),
            "trace requests, stages and batches with OpenTelemetry (microbatch[otel]; "
            "exporter from OTEL_TRACES_EXPORTER: console, the default, or otlp)",
            default=False,
            action="store_true",
            modes=frozenset({"plain", "workers"}),
            refused="Ray replicas are not traced yet",
        ),
        Option(
            ("--drain-delay-s",),
            "on SIGTERM, readiness answers 503 at once while requests are still served "
            "for this long, then the graceful shutdown (Kubernetes: a few seconds)",
            default=0.0,
            type=non_negative_float,
            modes=frozenset({"plain", "workers"}),
            refused="Ray Serve drains its own replicas",
        ),
        Option(
            ("--switch-interval-ms",),
            "the interpreter's GIL switch interval while serving (default: 0.5 when a "
            "stage steps in a thread, so the step thread is not kept waiting; else "
            "Python's 5)",
            type=positive_float,
            modes=frozenset({"plain", "workers"}),
            refused="Ray runs the replicas' processes",
        ),
        Option(
            ("--config",),
            "read settings from this TOML file: flag > environment > file > code",
            metavar="FILE",
        ),
        Option(
            ("--stage",),
            "a stage's batching setting (repeatable): max_batch_size, max_latency_ms, "
            "max_queue, timeout_s, isolate_errors or workers",
            default=(),
            action="append",
            metavar="NAME.SETTING=VALUE",
        ),
        Option(("--api-title",), "the OpenAPI document's title (default: the model's name)"),
        Option(("--api-version",), "the OpenAPI document's version (default: microbatch's)"),
        Option(
            ("--ray",),
            "serve as a Ray Serve application behind Ray's proxy (needs microbatch[ray])",
            default=False,
            action="store_true",
        ),
        Option(
            ("--replicas",),
            "replicas of the service",
            default=1,
            type=positive_int,
            modes=frozenset({"ray"}),
            refused=_RAY_ONLY,
        ),
        Option(
            ("--ray-address",),
            "cluster to join: auto or HOST:PORT (default: start a local Ray)",
            env="RAY_ADDRESS",
            modes=frozenset({"ray"}),
            refused=_RAY_ONLY,
        ),
        Option(
            ("--replica-cpus",),
            "CPUs per replica",
            default=1.0,
            type=non_negative_float,
            modes=frozenset({"ray"}),
            refused=_RAY_ONLY,
        ),
        Option(
            ("--replica-gpus",),
            "GPUs per replica, fractional allowed",
            default=0.0,
            type=non_negative_float,
            modes=frozenset({"ray"}),
            refused=_RAY_ONLY,
        ),
        Option(
            ("--replica-stages",),
            "a Service's stages in threads of each replica, or in worker processes",
            default="thread",
            choices=("thread", "process"),
            modes=frozenset({"ray"}),
            refused=_RAY_ONLY,
        ),
    ),
)

BENCH = Command(
    "bench",
    "load a running server: closed loop at concurrency levels, open loop at rates",
    (
        Option(("url",), "e.g. http://127.0.0.1:8000", metavar="URL"),
        Option(
            ("-c", "--concurrency"),
            "closed-loop connection counts, e.g. 1,16,64 (default: 1,16,64 unless --rate)",
            type=int_list,
        ),
        Option(("--rate",), "open-loop rates in requests/s, e.g. 500", default=(), type=float_list),
        Option(("-d", "--duration"), "seconds per run", default=10.0, type=positive_float),
        Option(
            ("--warmup",),
            "unmeasured seconds before each run",
            default=1.0,
            type=non_negative_float,
        ),
        Option(("--body-file",), "request bodies, one JSON value per line", exclusive="body"),
        Option(
            ("--body",),
            "one JSON request body (default: the service's examples, from its OpenAPI)",
            exclusive="body",
        ),
        Option(
            ("-H", "--header"),
            "extra request header 'Name: value' (repeatable)",
            default=(),
            action="append",
        ),
        Option(
            ("--auth-token",),
            "bearer token to send (unless -H gives an Authorization header)",
            env=_TOKEN_ENV,
        ),
        Option(
            ("--timeout",),
            "seconds before a request counts as timeout",
            default=30.0,
            type=positive_float,
        ),
        Option(
            ("--max-outstanding",),
            "open loop: most requests awaiting replies at once",
            default=1024,
            type=positive_int,
        ),
        Option(("--seed",), "seed of the open loop's arrivals", default=0, type=int),
        Option(("--json",), "print JSON instead of a table", default=False, action="store_true"),
        Option(("--plot",), "draw latency and throughput to this file", metavar="PNG"),
        Option(
            ("--no-progress",),
            "no progress bar (it shows only on a terminal)",
            default=False,
            action="store_true",
        ),
    ),
    description="Send requests to URL (POST; a bare http://HOST:PORT means /predict) in a "
    "closed loop at each concurrency level and/or an open loop of Poisson arrivals at "
    "each rate, and report req/s, latency percentiles, errors by status and the "
    "server's mean batch size (from /metrics).",
)

TUNE = Command(
    "tune",
    "measure a service's models in-process and advise batching settings",
    (
        Option(("target",), "e.g. examples.embeddings:service", metavar="MODULE:ATTR"),
        Option(("--p99-ms",), "latency target", default=50.0, type=positive_float),
        Option(("--max-batch",), "largest batch tried", default=64, type=positive_int),
        Option(("--repeats",), "timed runs per size", default=5, type=positive_int),
        Option(("--warmup",), "untimed runs per size", default=1, type=int),
        Option(("--gain",), "least throughput gain worth a larger batch", default=0.05, type=float),
        Option(("--json",), "print JSON instead of a table", default=False, action="store_true"),
        Option(("--plot",), "draw the curves and the advice to this file", metavar="PNG"),
    ),
    description="Run each stage's model on the service's warm-up examples at batch "
    "sizes 1, 2, 4, ... and advise max_batch_size and max_latency_ms per stage.",
)

DEMO = Command(
    "demo",
    "many concurrent callers of a batched model, in-process",
    (
        Option(("--callers",), "asyncio callers", default=256, type=positive_int),
        Option(("--threads",), "thread callers", default=32, type=positive_int),
        Option(("--seconds",), "length of each run", default=3.0, type=positive_float),
        Option(("--max-batch-size",), "largest batch", default=64, type=positive_int),
        Option(("--max-latency-ms",), "longest wait to fill a batch", default=10.0, type=float),
    ),
)

TOP = Command(
    "top",
    "a live view of a running server, from its /metrics (q or Ctrl-C quits)",
    (
        Option(("url",), "the server, e.g. http://127.0.0.1:8000", metavar="URL"),
        Option(("--interval",), "seconds between refreshes", default=1.0, type=positive_float),
        Option(("--auth-token",), "bearer token to send (if the server has one)", env=_TOKEN_ENV),
    ),
    description="Requests/s, p50/p99, per-stage batch sizes, queue depth, items in "
    "batches, workers and restarts, refreshed in place (needs microbatch[top]).",
)

COMMANDS: Mapping[str, Command] = {c.name: c for c in (SERVE, BENCH, TUNE, DEMO, TOP)}
"""Every command and its options: the one table."""


@dataclass(frozen=True)
class Parsed:
    """A command line, parsed: the command, every option's value (given, from the
    environment, or the default), and which options were given or found in the
    environment."""

    command: str
    values: Mapping[str, Any]
    given: frozenset[str] = field(default_factory=frozenset)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def serve_mode(values: Mapping[str, Any]) -> Mode:
    """The mode a ``serve`` command line runs in."""
    if values.get("ray"):
        return "ray"
    return "workers" if values.get("workers", 1) > 1 else "plain"


def build_parser() -> argparse.ArgumentParser:
    """The ``microbatch`` parser, built from :data:`COMMANDS` (options without defaults:
    an option left out is absent from the namespace)."""
    return parsers(COMMANDS.values())[0]


def parse(argv: Sequence[str] | None = None) -> Parsed:
    """Parse ``argv`` (default: ``sys.argv[1:]``): values filled from the environment,
    ``serve``'s config file and the defaults (flag > environment > file > code, see
    :mod:`._config`); a ``serve`` flag given in a mode it does not work in is refused.

    Raises:
        SystemExit: With status 2 and a message on stderr, for a bad command line.
    """
    parser, subs = parsers(COMMANDS.values())
    namespace = vars(parser.parse_args(argv))
    command = COMMANDS[namespace.pop("command")]
    sub = subs[command.name]
    values: dict[str, Any] = {}
    given: set[str] = set()
    try:
        file = _config_file(command, namespace)
        for option in command.options:
            names = env_names(option) if command is SERVE else (option.env,)
            env = next((name for name in names if name and os.environ.get(name)), None)
            if option.dest in namespace:
                values[option.dest] = namespace[option.dest]
            elif env is not None:
                values[option.dest] = from_text(option, os.environ[env], env)
            elif option.dest in file.values:
                values[option.dest] = from_file(option, file.values[option.dest], file.path)
            else:
                values[option.dest] = option.default
                continue
            given.add(option.dest)
        if command is SERVE:
            values["stage"] = stage_settings(
                namespace.get("stage", ()), os.environ.get(STAGE_ENV), file.stages, file.path
            )
    except ConfigError as error:
        sub.error(str(error))
    if command is SERVE:
        mode = serve_mode(values)
        for option in command.options:
            if option.dest in namespace and mode not in option.modes:  # given on the line
                sub.error(f"{option.name} does not work with {MODE_NAMES[mode]}: {option.refused}")
    return Parsed(command.name, values, frozenset(given))


def _config_file(command: Command, namespace: Mapping[str, Any]) -> ConfigFile:
    """``serve``'s config file (``--config`` or ``MICROBATCH_CONFIG``), or none."""
    path = namespace.get("config") or os.environ.get(CONFIG_ENV)
    if command is not SERVE or not path:
        return ConfigFile("")
    return read_config_file(path, {option.dest for option in command.options})


def options_table() -> str:
    """``serve``'s options by mode, as plain text (its ``--help`` epilog)."""
    return modes_table(SERVE)
