"""
The client's address behind reverse proxies (RFC 7239 Forwarded, and the
X-Forwarded-For convention): the hops are read right to left, starting at
the TCP peer, skipping every hop that is a trusted proxy; the first
untrusted hop is the client. Headers are read only when the peer itself is
trusted, since anyone else can write them. An IPv4 address is always
given as itself, never mapped into IPv6 (C{::ffff:a.b.c.d}, as a dual-stack
listener's socket gives it): mapped, every IPv4 client would share one /64
in L{address_key}, and a trusted IPv4 proxy would not be recognised.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_FOR = re.compile(r'(?:^|;)\s*for\s*=\s*("[^"]*"|[^;,\s]*)', re.IGNORECASE)


_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def _plain_network(network: Network) -> Network:
    """An IPv4 block written mapped into IPv6 (C{::ffff:10.0.0.0/104}) as the IPv4 block, as addresses are given."""
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED):
        return ipaddress.IPv4Network((int(network.network_address) & 0xFFFFFFFF, network.prefixlen - 96))
    return network


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """Addresses and CIDR blocks; L{ValueError} names the first that is neither."""
    networks = []
    for value in values:
        try:
            networks.append(_plain_network(ipaddress.ip_network(value.strip(), strict=False)))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address or CIDR block") from None
    return tuple(networks)


def _plain(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """
    C{ip} as text, unmapped and without an IPv6 zone id (C{%eth0}): a zone
    names an interface of the host that wrote it, never part of the
    client's address, and any text may follow the C{%} (spaces, quotes,
    controls, into the logs); the address with and without it is one client.
    """
    return str(getattr(ip, "ipv4_mapped", None) or ip).partition("%")[0]


def unmapped(address: str) -> str:
    """C{address}, or the IPv4 address it maps into IPv6."""
    if "." not in address or ":" not in address:
        return address
    try:
        return _plain(ipaddress.ip_address(address))
    except ValueError:
        return address


def _address(node: str) -> str | None:
    """An RFC 7239 node (or X-Forwarded-For item) as an address, port dropped; None when not an IP."""
    node = node.strip().strip('"').strip()
    if node.startswith("["):
        node = node[1:].partition("]")[0]
    elif node.count(":") == 1:
        node = node.partition(":")[0]
    try:
        return _plain(ipaddress.ip_address(node))
    except ValueError:
        return None


def is_trusted(address: str | None, trusted: tuple[Network, ...]) -> bool:
    """Whether C{address} is one of the trusted proxies."""
    if address is None or not trusted:
        return False
    try:
        ip = ipaddress.ip_address(unmapped(address))
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def forwarded_hops(forwarded: Iterable[str]) -> list[str | None]:
    """The C{for=} nodes of Forwarded header lines, in order; None for one that is no IP address."""
    hops: list[str | None] = []
    for line in forwarded:
        for element in line.split(","):
            match = _FOR.search(element)
            hops.append(_address(match.group(1)) if match else None)
    return hops


def client_address(peer: str, trusted: tuple[Network, ...], forwarded: Iterable[str] = (),
                   x_forwarded_for: Iterable[str] = ()) -> str:
    """
    The client's address: the peer itself unless it is a trusted proxy;
    then the rightmost untrusted hop of Forwarded (or, without it,
    X-Forwarded-For). A hop that is not an address, or a list that runs out
    while every hop is trusted, leaves the last trusted hop as the answer.
    """
    peer = unmapped(peer)
    if not trusted or not is_trusted(peer, trusted):
        return peer
    forwarded = list(forwarded)
    hops = forwarded_hops(forwarded) if forwarded else [
        _address(item) for line in x_forwarded_for for item in line.split(",")
    ]
    current = peer
    for hop in reversed(hops):
        if hop is None:
            return current
        current = hop
        if not is_trusted(hop, trusted):
            return hop
    return current


def address_key(address: str) -> str:
    """
    The key of a client address: an IPv6 address by its /64, the block one
    host usually holds, so that a host cannot escape a per-address count (a rate
    limit, the login throttle, the pending-request cap) by changing addresses.
    """
    address = unmapped(address)
    if ":" not in address:
        return address
    try:
        return str(ipaddress.IPv6Network(address + "/64", strict=False).network_address)
    except ValueError:
        return address
