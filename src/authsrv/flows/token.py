"""
The token endpoint (RFC 6749 section 3.2): the grant type is checked before
the client, so a request for a grant never offered says so plainly; then
the client is authenticated, must be allowed that grant, and the grant's
handler answers.
"""

from __future__ import annotations

from authsrv.flows.clients import authenticate_client
from authsrv.protocol.errors import UnauthorizedClient, UnsupportedGrantType
from authsrv.protocol.params import require


class TokenFlow:
    """C{grants} is a L{authsrv.flows.grants.GrantRegistry}; C{clients} answers C{get_client}."""

    def __init__(self, *, clients, grants):
        self._clients = clients
        self._grants = grants

    async def token(self, authorization: bytes | None, params: dict[str, str], now: int) -> dict:
        """The JSON token response, or an L{authsrv.protocol.errors.OAuthError}."""
        grant_type = require(params, "grant_type")
        handler = self._grants.get(grant_type)
        if handler is None:
            raise UnsupportedGrantType(f"grant_type must be one of {', '.join(self._grants.grant_types)}")
        client = await authenticate_client(self._clients, authorization, params)
        if grant_type not in client.grant_types:
            raise UnauthorizedClient(f"this client may not use grant_type {grant_type}")
        return await handler.exchange(client, params, now)
