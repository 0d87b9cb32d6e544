"""
A host name's addresses by a blocking lookup, for a thread pool of the
caller's own: the PostgreSQL pool, the remote document fetcher and the chat
platform's client each run their lookups on a pool apart, so that a name
whose servers never answer holds none of the reactor's threads.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Awaitable, Callable
from ipaddress import ip_address

from twisted.internet.defer import Deferred, fail
from twisted.internet.error import DNSLookupError
from twisted.python.threadpool import ThreadPool


class LookupsBusy(Exception):
    """As many lookups as allowed wait for a thread of the pool already: worth asking again in a few seconds."""


def host_addresses(host: str) -> list[str]:
    """Every address of C{host}, in the resolver's order, as libpq itself would try them."""
    found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(address[4][0] for address in found if isinstance(address[4][0], str)))


async def addresses_of(host: str, resolve: Callable[[str], Awaitable[list[str]]]) -> list[str]:
    """
    C{host} itself when it is an IP address, else every address
    C{resolve(host)} finds; L{DNSLookupError} (an C{OSError}) when it finds none.
    """
    try:
        return [str(ip_address(host))]
    except ValueError:
        pass
    addresses = await resolve(host)
    if not addresses:
        raise DNSLookupError(f"{host} resolves to no address")
    return addresses


STOPPING = "the server is stopping: no more host names are looked up"


class HostLookups:
    """
    C{lookups(host)}: a Deferred of C{host}'s addresses, looked up on
    C{pool}. While name servers hang, every thread of the pool waits on
    them and new lookups queue behind, long after their callers have given
    up; the pool's queue has no end, so after an outage it would work
    through every stale lookup before a fresh one. So a lookup whose
    Deferred was cancelled (its caller's timeout) is skipped when its turn
    comes, and at most C{waiting} lookups wait for a thread, skipped ones
    among them until their turn: a caller beyond that fails at once with
    L{LookupsBusy}, as do the ones still waiting when the pool stops (the
    server's shutdown, which waits for its threads' work: it waits for the
    lookups under way, never for each one queued behind them as well) and
    any asked for after it stopped.
    C{lookup} is the blocking lookup itself.
    """

    def __init__(self, reactor, pool: ThreadPool, waiting: int,
                 lookup: Callable[[str], list[str]] = host_addresses):
        self._reactor = reactor
        self._pool = pool
        self._most = waiting
        self._lookup = lookup
        self._lock = threading.Lock()
        self._waiting = 0

    def __call__(self, host: str) -> Deferred:
        if self._pool.joined:  # a stopped pool takes no work and says nothing: its Deferred would never fire
            return fail(LookupsBusy(STOPPING))
        with self._lock:
            if self._waiting >= self._most:
                return fail(LookupsBusy(f"host name lookups waiting for a thread: {self._waiting}, the most allowed"))
            self._waiting += 1
        given_up = threading.Event()
        result: Deferred = Deferred(lambda _: given_up.set())

        def run() -> list[str] | None:
            with self._lock:
                self._waiting -= 1
            if given_up.is_set():
                return None
            if self._pool.joined:
                raise LookupsBusy(STOPPING)
            return self._lookup(host)

        def landed(succeeded: bool, outcome) -> None:
            if not result.called:
                result.callback(outcome) if succeeded else result.errback(outcome)

        self._pool.callInThreadWithCallback(
            lambda succeeded, outcome: self._reactor.callFromThread(landed, succeeded, outcome), run)
        return result
