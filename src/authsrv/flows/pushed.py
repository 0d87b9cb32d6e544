"""
The pushed authorization request endpoint (RFC 9126) and the authorization
endpoint's side of it: a request pushed by an authenticated client is kept
in the store under the hash of a random C{request_uri} for a minute, and
the authorization endpoint takes it out once, for that client only. A push
with a DPoP proof binds the code to the proof's key (RFC 9449 section 10.1).
"""

from __future__ import annotations

from authsrv import events
from authsrv.flows.clients import authenticate_client
from authsrv.protocol.authorize import unsafe
from authsrv.protocol.errors import InvalidDpopProof
from authsrv.protocol.pushed import (
    REQUEST_URI_PREFIX,
    REQUEST_URI_TTL,
    UNUSABLE,
    push_params,
    pushed_args,
    pushed_query,
    request_uri_of,
)
from authsrv.records import Client, PushedRequest
from authsrv.tokens import new_token, token_hash


class PushedRequests:
    """
    C{clients} answers C{get_client} and authenticates as the token
    endpoint does; C{required} holds every client to pushed requests
    (the server's C{require_pushed_authorization_requests}); C{dpop} is the
    L{authsrv.flows.dpop.DpopVerifier} when DPoP is offered, C{url} the
    endpoint's public URL a proof names.
    """

    def __init__(self, *, store, clients, required: bool = False, ttl: int = REQUEST_URI_TTL,
                 dpop=None, url: str = ""):
        self._dpop = dpop
        self._url = url
        self._store = store
        self._clients = clients
        self.required = required
        self._ttl = ttl

    async def push(self, authorization: bytes | None, args: dict[bytes, list[bytes]], now: int, address: str,
                   dpop: list[bytes] | None = None, checked: Client | None = None) -> dict:
        """
        RFC 9126 section 2: the client authenticated, its request validated
        and kept; the 201 answer's body. C{resource} may repeat, as at the
        authorization endpoint; credentials and other fields may not.
        C{address} is the client's, for the audit event; C{dpop} the
        request's DPoP header lines; C{checked} the client the rate limiter
        already authenticated from these credentials.
        """
        client = checked or await authenticate_client(self._clients, authorization, push_params(args), pushed=True,
                                                      address=address)
        if dpop and self._dpop is not None:
            args = await self._bind(args, dpop, now)
        query = pushed_query(client, args)
        request_uri = REQUEST_URI_PREFIX + new_token()
        await self._store.save_pushed_request(PushedRequest(
            uri_hash=token_hash(request_uri), client_id=client.client_id, query=query,
            created_at=now, expires_at=now + self._ttl,
        ))
        events.request_pushed(client_id=client.client_id, address=address)
        return {"request_uri": request_uri, "expires_in": self._ttl}

    async def _bind(self, args: dict[bytes, list[bytes]], dpop: list[bytes], now: int) -> dict[bytes, list[bytes]]:
        """
        RFC 9449 section 10.1: the proof checked and used up, and its key's
        thumbprint the request's C{dpop_jkt}; a C{dpop_jkt} naming another
        key is refused.
        """
        proof = await self._dpop.verify(dpop, method="POST", url=self._url, now=now)
        if args.get(b"dpop_jkt", [proof.jkt.encode()]) != [proof.jkt.encode()]:
            raise InvalidDpopProof("dpop_jkt must be the thumbprint of the key that signed the DPoP proof")
        return {**args, b"dpop_jkt": [proof.jkt.encode()]}

    async def take(self, client: Client, args: dict[bytes, list[bytes]], now: int,
                   address: str) -> dict[bytes, list[bytes]]:
        """
        The pushed request an authorization request's C{request_uri} names,
        as that request's arguments; used up. One that is unknown, used,
        expired or another client's is a page: nothing in it can be
        trusted to redirect to (RFC 9126 section 4, RFC 9101 section 6.2);
        its audit event names the browser's C{address}.
        """
        pushed = await self._store.take_pushed_request(token_hash(request_uri_of(args)), client.client_id, now)
        if pushed is None:
            events.request_uri_refused(client_id=client.client_id, address=address)
            raise unsafe(UNUSABLE)
        return pushed_args(pushed.query)
