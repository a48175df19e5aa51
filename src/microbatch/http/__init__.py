"""Serve a Service or a ``@microbatch.batch`` function over HTTP (ASGI).

``microbatch.http.app(service)`` is an ASGI app for any ASGI server;
``microbatch serve MODULE:ATTR`` runs it on microbatch's own HTTP/1.1 server
(:mod:`microbatch.serve.connection`), which calls the predict routes without ASGI.
"""

from .app import HttpApp, HttpConfig, app

__all__ = ["HttpApp", "HttpConfig", "app"]
