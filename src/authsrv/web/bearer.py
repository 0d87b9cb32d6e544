"""
The shared-secret bearer credential of the internal and admin APIs: one
operator-configured secret per API, which every caller presents.
"""

from __future__ import annotations

import hashlib
import hmac


def _digest(secret: bytes) -> bytes:
    """Secrets are compared as digests of equal length, so the comparison's time says nothing of the length."""
    return hashlib.sha256(secret).digest()


class BearerSecret:
    """A configured secret, kept only as its digest, and the check of a request's C{Authorization} against it."""

    def __init__(self, secret: str):
        self._digest = _digest(secret.encode())

    def presented_by(self, request) -> bool:
        """Whether the request's C{Authorization} is C{Bearer} with this secret."""
        scheme, _, token = (request.getHeader(b"authorization") or b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(_digest(token.strip()), self._digest)
