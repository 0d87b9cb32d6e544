"""
The pushed authorization request endpoint (RFC 9126) and the authorization
endpoint's side of it: a request pushed by an authenticated client is kept
in the store under the hash of a random C{request_uri} for a minute, and
the authorization endpoint takes it out once, for that client only.
"""

from __future__ import annotations

from authsrv import events
from authsrv.flows.clients import authenticate_client
from authsrv.protocol.authorize import unsafe
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
    (the server's C{require_pushed_authorization_requests}).
    """

    def __init__(self, *, store, clients, required: bool = False, ttl: int = REQUEST_URI_TTL):
        self._store = store
        self._clients = clients
        self.required = required
        self._ttl = ttl

    async def push(self, authorization: bytes | None, args: dict[bytes, list[bytes]], now: int) -> dict:
        """
        RFC 9126 section 2: the client authenticated, its request validated
        and kept; the 201 answer's body. C{resource} may repeat, as at the
        authorization endpoint; credentials and other fields may not.
        """
        client = await authenticate_client(self._clients, authorization, push_params(args))
        query = pushed_query(client, args)
        request_uri = REQUEST_URI_PREFIX + new_token()
        await self._store.save_pushed_request(PushedRequest(
            uri_hash=token_hash(request_uri), client_id=client.client_id, query=query,
            created_at=now, expires_at=now + self._ttl,
        ))
        events.request_pushed(client_id=client.client_id)
        return {"request_uri": request_uri, "expires_in": self._ttl}

    async def take(self, client: Client, args: dict[bytes, list[bytes]], now: int) -> dict[bytes, list[bytes]]:
        """
        The pushed request an authorization request's C{request_uri} names,
        as that request's arguments; used up. One that is unknown, used,
        expired or another client's is a page: nothing in it can be
        trusted to redirect to (RFC 9126 section 4, RFC 9101 section 6.2).
        """
        pushed = await self._store.take_pushed_request(token_hash(request_uri_of(args)), client.client_id, now)
        if pushed is None:
            events.request_uri_refused(client_id=client.client_id)
            raise unsafe(UNUSABLE)
        return pushed_args(pushed.query)
