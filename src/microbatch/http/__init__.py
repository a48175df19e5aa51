"""Serve a Service or a ``@microbatch.batch`` function over HTTP (ASGI).

``microbatch.http.app(service)`` is an ASGI app for any ASGI server;
``microbatch serve MODULE:ATTR`` runs it under uvicorn.
"""

from .app import HttpApp, HttpConfig, app

__all__ = ["HttpApp", "HttpConfig", "app"]
