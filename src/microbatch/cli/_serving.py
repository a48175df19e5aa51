"""``microbatch serve MODULE:ATTR [MODULE:ATTR...]`` (with ``--grpc-port``) and
``--workers N``: settings from the command line, then the running server of
:mod:`microbatch.serve`."""

from __future__ import annotations

import ipaddress
import logging
import sys
from collections.abc import Sequence
from typing import Any

from ..http.app import HttpApp, HttpConfig
from ..http.services import Services
from ..loading import as_servable, load_target
from ..logs import LogFormat
from ..logs import configure as configure_logs
from ..serve._workers import serve_workers
from ..serve.server import ServeSettings, serve
from ..serve.switch_interval import switch_interval_for
from ..types import Servable
from ._config import apply_stage_settings
from ._options import Parsed

__all__ = ["http_config", "run_serve", "serve_settings"]

logger = logging.getLogger("microbatch.http")


def http_config(options: Parsed) -> HttpConfig:
    """The HTTP app's settings (every mode: plain, ``--workers``, each Ray replica).

    Raises:
        ValueError: A setting is out of range.
    """
    return HttpConfig(
        max_body_bytes=options.max_body_bytes,
        default_timeout_s=options.timeout_ms / 1000.0,
        body_timeout_s=options.body_timeout_s,
        auth_token=options.auth_token or None,
        access_log=options.access_log,
        server_timing=not options.no_server_timing,
        tracing=options.otel,
        api_title=options.api_title or None,
        api_version=options.api_version or None,
    )


def serve_settings(options: Parsed, servables: Sequence[object] = ()) -> ServeSettings:
    """How microbatch's own HTTP server listens and shuts down (and, for
    ``servables`` that step in a thread, its switch interval)."""
    asked = options.switch_interval_ms
    return ServeSettings(
        host=options.host,
        port=options.port,
        graceful_timeout_s=options.graceful_timeout_s,
        header_timeout_s=options.header_timeout_s,
        max_header_bytes=options.max_header_bytes,
        keep_alive_s=options.keep_alive_s,
        max_connections=options.max_connections,
        log_level=options.log_level,
        log_format=options.log_format,
        drain_delay_s=options.drain_delay_s,
        switch_interval_s=switch_interval_for(servables, None if asked is None else asked / 1000.0),
    )


def configure_logging(level: str, log_format: LogFormat = "text") -> None:
    """Log every logger to stderr at ``level``, in ``log_format``."""
    configure_logs(level, log_format)


def warn_if_open(host: str, token: str | None) -> None:
    """A warning when serving beyond loopback without a token."""
    if token is None and not _is_loopback(host):
        logger.warning(
            "serving on %s without --auth-token: anyone who can reach it may call it", host
        )


def run_serve(options: Parsed) -> int:
    """Run ``microbatch serve`` (plain or ``--workers N``); return the exit status."""
    configure_logging(options.log_level, options.log_format)
    try:
        served = apply_stage_settings(load_target(options.target), options.stage)
        servables = [as_servable(served)]
        servables += [as_servable(load_target(more)) for more in options.more_targets]
        config = http_config(options)
        app: Any = (
            HttpApp(servables[0], config) if len(servables) == 1 else Services(servables, config)
        )
        if options.grpc_port is not None:
            app = _with_grpc(app, servables, options, config)
    except (ImportError, AttributeError, ValueError, TypeError) as error:
        print(f"microbatch serve: {error}", file=sys.stderr)
        return 2
    warn_if_open(options.host, config.auth_token)
    settings = serve_settings(options, servables)
    if options.workers > 1:
        return serve_workers(options.target, served, config, settings, options.workers)
    return serve(app, settings)


def _with_grpc(
    app: Any, servables: Sequence[Servable[Any, Any]], options: Parsed, config: HttpConfig
) -> Any:
    """``app`` with the v2 gRPC service of ``servables`` inside its lifespan.

    Raises:
        ImportError: grpcio is not installed.
    """
    try:
        from ..grpc.alongside import WithGrpc
        from ..grpc.server import GrpcConfig, GrpcServer
    except ImportError as error:
        raise ImportError(f"--grpc-port needs microbatch[grpc] ({error})") from None
    from ..inference import InferenceModel

    grpc_config = GrpcConfig(
        host=options.host,
        port=options.grpc_port,
        max_message_bytes=config.max_body_bytes,
        default_timeout_s=config.default_timeout_s,
        auth_token=config.auth_token,
        graceful_timeout_s=options.graceful_timeout_s,
    )
    models = {servable.name: InferenceModel(servable) for servable in servables}

    def announce(port: int) -> None:
        print(f"microbatch grpc serving on {options.host}:{port}", flush=True)

    tracer = getattr(app, "tracer", None)  # --otel traces gRPC calls too
    return WithGrpc(app, GrpcServer(models, grpc_config, tracer), on_listening=announce)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
