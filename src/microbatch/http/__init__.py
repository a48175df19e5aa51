"""Serve a Service or a ``@microbatch.batch`` function over HTTP (ASGI).

``microbatch.http.app(service)`` is an ASGI app for any ASGI server;
``microbatch serve MODULE:ATTR`` runs it on microbatch's own HTTP/1.1 server
(:mod:`microbatch.serve.connection`), which calls the predict routes without ASGI.
Besides ``/predict``, it speaks the Open Inference Protocol v2 (``/v2/...``) and,
for a service that declares an :class:`EmbeddingModel`, OpenAI's ``/v1/embeddings``,
and for one that declares a :class:`CompletionModel`, ``/v1/completions`` and
``/v1/chat/completions``.
:class:`Services` serves several services in one ASGI app.
"""

from .app import HttpApp, HttpConfig, app
from .completions import CompletionModel
from .openai import EmbeddingModel
from .services import Services

__all__ = ["CompletionModel", "EmbeddingModel", "HttpApp", "HttpConfig", "Services", "app"]
