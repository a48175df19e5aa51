"""Runnable microbatch services: ``microbatch serve examples.embeddings:service``.

Each module defines its request/response types, its models and a module-level
``service``. They need the ``examples`` extra: ``pip install -e '.[examples]'``.
"""
