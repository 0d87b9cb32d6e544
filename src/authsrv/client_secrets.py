"""
client_secret_jwt (RFC 7523, OIDC Core section 9) proves the client secret
with an HMAC, so the server needs the secret itself, not only its hash. For
clients registered with that method alone, the secret is also kept sealed
(L{authsrv.sealing}) under the key of C{[client_secrets]}, which lives in
the config's secret file or environment, never in the store: a copy of the
database opens no secret. Every other client keeps only the hash.
"""

from __future__ import annotations

import json

from authsrv.protocol.clientauth import CLIENT_SECRET_JWT
from authsrv.records import Client
from authsrv.sealing import Sealer
from authsrv.tokens import new_token

_OWNER = b"authsrv client secret\x00"
HMAC_SECRET_BYTES = 48
"""
Random bytes of a generated client_secret_jwt secret: 64 base64url
characters, whose octets key HS512 at its full 512 bits (RFC 7518 section
3.2), so the client may choose any of HS256, HS384 and HS512.
"""


def new_client_secret(method: str | None) -> str:
    """A fresh secret for a client authenticating with C{method}: longer for client_secret_jwt, 256 bits otherwise."""
    return new_token(HMAC_SECRET_BYTES if method == CLIENT_SECRET_JWT else 32)


class SecretKeeper:
    """Seals the secrets of client_secret_jwt clients, and opens them to check an assertion."""

    def __init__(self, key: bytes):
        self._sealer = Sealer(key)

    def seal(self, client_id: str, current: str, previous: str | None = None) -> bytes:
        """The current secret and, during a rotation's overlap, the previous one, sealed for C{client_id}."""
        secrets = [current] if previous is None else [current, previous]
        return self._sealer.seal(json.dumps(secrets).encode(), _OWNER + client_id.encode())

    def secrets(self, client: Client, now: int) -> tuple[str, ...]:
        """
        The secrets an assertion of C{client} may be keyed with: the current
        one, and the previous one until C{previous_secret_until}; raises
        L{authsrv.sealing.Unsealable} when this key cannot open them.
        """
        if client.sealed_secret is None:
            return ()
        secrets = json.loads(self._sealer.open(client.sealed_secret, _OWNER + client.client_id.encode()))
        in_overlap = client.previous_secret_hash is not None and (client.previous_secret_until or 0) > now
        return tuple(secrets[:2] if in_overlap else secrets[:1])
