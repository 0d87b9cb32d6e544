"""
Token revocation (RFC 7009, docs/design.md Revocation): a client ends one of its
own tokens; a refresh token takes its whole grant with it. The answer never
tells whether anything was revoked, so it reveals nothing about tokens of
other clients.
"""

from __future__ import annotations

from authsrv import events
from authsrv.flows.clients import authenticate_client
from authsrv.protocol.params import require
from authsrv.records import Client, RevokedAccess, RevokedRefresh
from authsrv.tokens import token_hash


class RevocationFlow:
    def __init__(self, *, store, clients):
        self._store = store
        self._clients = clients

    async def revoke(
        self, authorization: bytes | None, params: dict[str, str], now: int, checked: Client | None = None,
        address: str | None = None,
    ) -> None:
        """
        Revoke C{params["token"]} if it is the authenticated client's; token_type_hint is not needed.
        C{checked}: the client the rate limiter already authenticated from these credentials; C{address}
        the caller's, which the audit event names.
        """
        client = checked or await authenticate_client(self._clients, authorization, params, address=address)
        result = await self._store.revoke_token(token_hash(require(params, "token")), client.client_id, now)
        if isinstance(result, RevokedRefresh):
            events.token_revoked(client_id=client.client_id, grant_id=result.grant_id, kind="refresh",
                                 address=address)
        elif isinstance(result, RevokedAccess):
            events.token_revoked(client_id=client.client_id, grant_id=result.grant_id, kind="access",
                                 address=address)
