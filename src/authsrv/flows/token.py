"""
The token endpoint (RFC 6749 section 3.2): the grant type is checked before
the client, so a request for a grant never offered says so plainly; then
the client is authenticated, must be allowed that grant, a DPoP proof (when
sent, and DPoP is offered) is checked, and the grant's handler answers.
"""

from __future__ import annotations

from collections.abc import Callable

from authsrv.flows.clients import authenticate_client
from authsrv.flows.offered import offered_grants
from authsrv.protocol.errors import InvalidDpopProof, UnauthorizedClient, UnsupportedGrantType
from authsrv.protocol.params import require
from authsrv.records import Client


class TokenFlow:
    """
    C{grants} is a L{authsrv.flows.grants.GrantRegistry}; C{clients} answers
    C{get_client}; C{features()} are the optional features in use
    (L{authsrv.flows.offered.OfferedFeatures}), so that a refusal names only
    the grant types discovery lists; C{dpop} is an
    L{authsrv.flows.dpop.DpopVerifier}, None when DPoP is not offered (a DPoP
    header is then ignored, RFC 9449 section 5); C{url} is the endpoint's
    public URL, a proof's C{htu}.
    """

    def __init__(self, *, clients, grants, features: Callable[[], frozenset[str]], dpop=None, url: str = ""):
        self._clients = clients
        self._grants = grants
        self._features = features
        self._dpop = dpop
        self._url = url

    async def token(
        self, authorization: bytes | None, params: dict[str, str], now: int, dpop: list[bytes] | None = None,
        checked: Client | None = None, address: str | None = None,
    ) -> dict:
        """
        The JSON token response, or an L{authsrv.protocol.errors.OAuthError};
        C{dpop} are the request's DPoP header lines; C{checked} the client
        the rate limiter already authenticated from these credentials;
        C{address} the caller's, which the audit events name.
        """
        grant_type = require(params, "grant_type")
        handler = self._grants.get(grant_type)
        if handler is None:
            offered = offered_grants(self._grants.grant_types, self._features())
            raise UnsupportedGrantType(f"grant_type must be one of {', '.join(offered)}")
        client = checked or await authenticate_client(self._clients, authorization, params, address=address)
        if grant_type not in client.grant_types:
            raise UnauthorizedClient(f"this client may not use grant_type {grant_type}")
        jkt = None
        if dpop and self._dpop is not None:
            jkt = (await self._dpop.verify(dpop, method="POST", url=self._url, now=now)).jkt
        elif client.dpop_bound_access_tokens:
            raise InvalidDpopProof("this client must send a DPoP proof (RFC 9449) with every token request")
        return await handler.exchange(client, params, now, jkt, address)
