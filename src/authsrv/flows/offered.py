"""
What discovery advertises beyond the contract depends on the clients: the
client_credentials grant and the private_key_jwt and client_secret_jwt
authentication methods are listed only while some client is registered to
use them (docs/design.md, Machine clients); client_secret_jwt also while
clients may register with it, and never without the key that seals its
secrets (L{authsrv.protocol.discovery.advertised_assertion_algs}).
Discovery is served from memory, so the answer is recomputed from the
store's clients at most once a minute, off the request's path: a discovery
request returns at once with what was last found.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from authsrv.protocol.clientauth import ASSERTION_METHODS
from authsrv.records import Client

OPTIONAL_GRANTS = ("client_credentials",)
OPTIONAL_AUTH_METHODS = ASSERTION_METHODS
REFRESH_EVERY = 60.0


def features_of(clients) -> frozenset[str]:
    """The optional grant types and authentication methods some of C{clients} uses."""
    used: set[str] = set()
    for client in clients:
        used.update(g for g in client.grant_types if g in OPTIONAL_GRANTS)
        if client.token_endpoint_auth_method in OPTIONAL_AUTH_METHODS:
            used.add(client.token_endpoint_auth_method)
    return frozenset(used)


def offered_grants(grant_types: tuple[str, ...], features: frozenset[str]) -> tuple[str, ...]:
    """The grant types of C{grant_types} offered now: an optional one only while some client uses it."""
    return tuple(g for g in grant_types if g not in OPTIONAL_GRANTS or g in features)


class OfferedFeatures:
    """C{current()}: the optional features in use; starts from C{declared} (the config file's clients)."""

    log = Logger()

    def __init__(self, store, clock, declared: tuple[Client, ...], every: float = REFRESH_EVERY):
        self._store = store
        self._clock = clock
        self._every = every
        self._features = features_of(declared)
        self._due = 0.0
        self._refreshing = False

    def current(self) -> frozenset[str]:
        if self._clock.seconds() >= self._due and not self._refreshing:
            self._refreshing = True
            Deferred.fromCoroutine(self._refresh())
        return self._features

    async def _refresh(self) -> None:
        try:
            self._features = features_of(await self._store.list_clients())
            self._due = self._clock.seconds() + self._every
        except Exception:
            self.log.failure("could not list the clients for discovery; trying again at the next request")
        finally:
            self._refreshing = False
