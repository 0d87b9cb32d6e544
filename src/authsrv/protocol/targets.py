"""
Where the server may send requests of its own (back-channel logout): never
to an address that reaches the machine's own surroundings rather than a
relying party, such as a cloud's metadata service (server-side request
forgery). Loopback and private addresses stay allowed: relying parties often
sit on the same host or network.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from urllib.parse import urlsplit

from authsrv.protocol.clients import redirect_uri_problem

_METADATA = {ip_address("169.254.169.254"), ip_address("fd00:ec2::254")}
_THIS_NETWORK = ip_network("0.0.0.0/8")
_BROADCAST = ip_address("255.255.255.255")
_NAT64 = ip_network("64:ff9b::/96")
"""The well-known NAT64 prefix (RFC 6052): a translator carries such an address to the IPv4 one in its last 32 bits."""


def _address(text: str) -> IPv4Address | IPv6Address | None:
    """
    The address C{text} names, an IPv4 one embedded in IPv6 (mapped, 6to4,
    NAT64) unwrapped; None when it is no address.
    """
    try:
        address: IPv4Address | IPv6Address = ip_address(text)
    except ValueError:
        return None
    if not isinstance(address, IPv6Address):
        return address
    unscoped = IPv6Address(str(address).partition("%")[0])
    if unscoped in _NAT64:
        return IPv4Address(int(unscoped) & 0xFFFFFFFF)
    return unscoped.ipv4_mapped or unscoped.sixtofour or unscoped


def address_problem(text: str) -> str | None:
    """Why the server must not connect to the IP address C{text}, or None (also None when it is no address)."""
    address = _address(text)
    if address is None:
        return None
    if address in _METADATA:
        return f"{text} is a cloud metadata address"
    if address.is_link_local:
        return f"{text} is a link-local address"
    if address.is_unspecified or (isinstance(address, IPv4Address) and address in _THIS_NETWORK):
        return f"{text} is an unspecified address"
    if address.is_multicast:
        return f"{text} is a multicast address"
    if address == _BROADCAST:
        return f"{text} is the broadcast address"
    return None


def private_address_problem(text: str) -> str | None:
    """
    Why the server must not fetch a document from the IP address C{text}
    when only public addresses are allowed (a client's C{jwks_uri}, where
    anyone may name any URL): every refused address of L{address_problem},
    and loopback, private, shared and reserved ones too. Reserved is asked
    apart: Python 3.11 takes reserved IPv6 ranges such as ::/8 for global,
    and site-local ones (fec0::/10, deprecated but still routed inside some
    networks) too.
    """
    problem = address_problem(text)
    if problem:
        return problem
    address = _address(text)
    if address is None:
        return None
    if address.is_loopback:
        return f"{text} is a loopback address"
    if not address.is_global or address.is_reserved or (isinstance(address, IPv6Address) and address.is_site_local):
        return f"{text} is a private or reserved address"
    return None


def backchannel_uri_problem(uri: str) -> str | None:
    """
    What is wrong with C{uri} as a back-channel logout URI, or None: an
    http(s) URI as redirect URIs are, whose host is no refused address.
    Names are checked again when they are resolved, at each delivery.
    """
    problem = redirect_uri_problem(uri)
    if problem:
        return problem
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return f"{uri!r} must use https (plain http only on the loopback interface)"
    host_problem = address_problem(parts.hostname or "")
    return f"{uri!r} is refused: {host_problem}" if host_problem else None
