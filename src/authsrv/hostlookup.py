"""
A host name's addresses by a blocking lookup, for a thread pool of the
caller's own: the PostgreSQL pool, the remote document fetcher and the chat
platform's client each run their lookups on a pool apart, so that a name
whose servers never answer holds none of the reactor's threads.
"""

from __future__ import annotations

import socket


def host_addresses(host: str) -> list[str]:
    """Every address of C{host}, in the resolver's order, as libpq itself would try them."""
    found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(address[4][0] for address in found if isinstance(address[4][0], str)))
