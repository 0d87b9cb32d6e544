"""
The token endpoint's grant types (RFC 6749 section 4), one module each, as
fosite's C{flow_<grant>.go}: a handler names its C{grant_type} and answers
C{exchange(client, params, now, jkt, address)} with the JSON token response
or an L{authsrv.protocol.errors.OAuthError}; C{jkt} is the thumbprint of the
key of the request's checked DPoP proof, None without one; C{address} the
caller's address, for the audit events. The registry is what the token
endpoint dispatches on and what discovery advertises.
"""

from __future__ import annotations

from typing import Protocol

from authsrv.protocol.device import DEVICE_CODE_GRANT
from authsrv.records import Client

GRANT_TYPES = ("authorization_code", "refresh_token", DEVICE_CODE_GRANT, "client_credentials")
"""The grant types this server implements: what a client's registration may name."""


class GrantHandler(Protocol):
    grant_type: str

    async def exchange(self, client: Client, params: dict[str, str], now: int, jkt: str | None,
                       address: str | None) -> dict: ...


class GrantRegistry:
    """The offered grant handlers, in the order discovery lists them."""

    def __init__(self, handlers: list[GrantHandler]):
        self._handlers = {handler.grant_type: handler for handler in handlers}

    @property
    def grant_types(self) -> tuple[str, ...]:
        return tuple(self._handlers)

    def get(self, grant_type: str) -> GrantHandler | None:
        return self._handlers.get(grant_type)
