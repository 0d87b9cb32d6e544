"""
Clients are read on every token, introspection and revocation request and
change rarely, so each lookup is kept for a couple of seconds: an operator's
change reaches every instance within that time, and the hot paths save a
trip through the store. The server key that client secret hashes are keyed
with never changes, so it is read once.
"""

from __future__ import annotations

from authsrv.protocol.clientauth import authenticate, client_credentials
from authsrv.records import Client
from authsrv.tokens import CLIENT_SECRET_KEY

TTL = 2.0
MAX_ENTRIES = 10_000


class ClientCache:
    """Provides C{get_client} like the store, answering recent lookups from memory."""

    def __init__(self, store, clock, ttl: float = TTL):
        self._store = store
        self._clock = clock
        self._ttl = ttl
        self._entries: dict[str, tuple[float, Client | None]] = {}
        self._key: bytes | None = None

    async def secret_key(self) -> bytes:
        """The server key of client secret hashes, from the store on first use."""
        if self._key is None:
            self._key = await self._store.server_key(CLIENT_SECRET_KEY)
        return self._key

    def seconds(self) -> float:
        """The clock's time, which decides whether a rotated-out client secret still works."""
        return self._clock.seconds()

    async def get_client(self, client_id: str) -> Client | None:
        now = self._clock.seconds()
        entry = self._entries.get(client_id)
        if entry is not None and entry[0] > now:
            return entry[1]
        client = await self._store.get_client(client_id)
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        self._entries[client_id] = (now + self._ttl, client)
        return client


async def authenticate_client(clients, authorization: bytes | None, params: dict[str, str]) -> Client:
    """
    The client a token, introspection or revocation request comes from
    (client_secret_basic, client_secret_post, or a public client by its
    client_id), or L{authsrv.protocol.errors.InvalidClient}.
    """
    credentials = client_credentials(authorization, params)
    client = await clients.get_client(credentials.client_id)
    return authenticate(client, credentials, await clients.secret_key(), int(clients.seconds()))
