"""Logging of ``microbatch serve``: one format for every logger (microbatch's, uvicorn's,
the user's), as text or as one JSON object per line, with the request id of the
request being served on each line logged while serving it.

Nothing here runs at import: the command line calls :func:`configure` once.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any, Literal, TextIO

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "LogFormat",
    "RequestIdFilter",
    "TextFormatter",
    "configure",
    "current_request_id",
]

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "microbatch_request_id", default=None
)
"""The id of the request the running code serves (set by the HTTP app), or None."""

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The attributes every LogRecord has: anything else on a record came as ``extra=``.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "request_id"}


class RequestIdFilter(logging.Filter):
    """Puts :data:`current_request_id` on every record as ``request_id`` (a handler
    filter: it sees the records of every logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the request id; keep the record."""
        if getattr(record, "request_id", None) is None:
            record.request_id = current_request_id.get()
        return True


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message request_id=...`` (the request id when serving a
    request; other extras, such as the access log's fields, only in JSON: its text
    message already says them)."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line (a traceback follows on its own lines)."""
        text = super().format(record)
        request_id = getattr(record, "request_id", None)
        if request_id is None:
            return text
        head, newline, rest = text.partition("\n")
        return f"{head} request_id={request_id}{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, ``request_id`` when serving a request, ``traceback`` when there is
    one, and the record's extras (the access log's ``method``, ``path``, ...)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        entry: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["traceback"] = record.exc_text
        entry.update(_extras(record))
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure(level: str, log_format: str = "text", stream: TextIO | None = None) -> None:
    """Log every logger's records to ``stream`` (default: stderr) at ``level`` in one
    format. uvicorn's loggers are made to propagate here, so they share it.

    Raises:
        ValueError: An unknown level or format.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _STANDARD and not key.startswith("_") and key != "color_message"
    }


def _utc(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"
