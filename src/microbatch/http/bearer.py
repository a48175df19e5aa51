"""The bearer token that guards every route but the health probes
(``Authorization: Bearer <token>``), compared in constant time."""

from __future__ import annotations

import hmac

from .asgi import Scope, header
from .status import Unauthorized

__all__ = ["authorize", "expected_authorization"]


def expected_authorization(token: str | None) -> bytes | None:
    """The exact ``Authorization`` value that ``token`` requires (None: no token)."""
    return None if token is None else b"Bearer " + token.encode()


def authorize(scope: Scope, expected: bytes) -> None:
    """Let the request through only with the ``expected`` ``Authorization`` header.

    Raises:
        Unauthorized: The header is missing or wrong (401).
    """
    given = header(scope, b"authorization") or b""
    if not hmac.compare_digest(given, expected):
        raise Unauthorized("a bearer token is required (Authorization: Bearer <token>)")
