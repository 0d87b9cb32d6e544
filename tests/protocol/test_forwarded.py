"""The client address behind trusted proxies (RFC 7239 and X-Forwarded-For), as a pure function."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.address import IPv6Address
from twisted.web.test.requesthelper import DummyRequest

from authsrv.protocol.forwarded import address_key, client_address, parse_networks
from authsrv.web.forms import client_address_of

PROXIES = parse_networks(["127.0.0.1/32", "10.0.0.0/8", "2001:db8:1::/48"])


@pytest.mark.parametrize(
    "peer, forwarded, xff, client",
    [
        ("198.51.100.1", ["for=192.0.2.9"], [], "198.51.100.1"),
        ("198.51.100.1", [], ["192.0.2.9"], "198.51.100.1"),
        ("127.0.0.1", [], [], "127.0.0.1"),
        ("127.0.0.1", ["for=192.0.2.60;proto=https;by=127.0.0.1"], [], "192.0.2.60"),
        ("127.0.0.1", ['for="192.0.2.60:4711"'], [], "192.0.2.60"),
        ("127.0.0.1", ['For="[2001:db8:cafe::17]:4711"'], [], "2001:db8:cafe::17"),
        ("127.0.0.1", ["for=203.0.113.5, for=192.0.2.60, for=10.1.2.3"], [], "192.0.2.60"),
        ("127.0.0.1", ["for=203.0.113.5", "for=10.9.9.9"], [], "203.0.113.5"),
        ("127.0.0.1", [], ["203.0.113.5, 192.0.2.60, 10.1.2.3"], "192.0.2.60"),
        ("127.0.0.1", [], ["10.1.1.1, 10.1.2.3"], "10.1.1.1"),
        ("127.0.0.1", ["for=_hidden, for=10.1.2.3"], [], "10.1.2.3"),
        ("127.0.0.1", ["for=unknown"], [], "127.0.0.1"),
        ("127.0.0.1", ["for=192.0.2.60"], ["203.0.113.5"], "192.0.2.60"),
        ("127.0.0.1", ["by=10.0.0.1"], [], "127.0.0.1"),
        ("2001:db8:1::5", [], ["192.0.2.1"], "192.0.2.1"),
        # An IPv6 zone id names an interface of the host that wrote it: dropped, whatever text it holds.
        ("127.0.0.1", [], ['fe80::1%a b" x\x01'], "fe80::1"),
        ("127.0.0.1", ['for="[fe80::2%25eth0]:4711"'], [], "fe80::2"),
    ],
)
def test_rightmost_untrusted_hop(peer, forwarded, xff, client):
    assert client_address(peer, PROXIES, forwarded, xff) == client


def test_no_trusted_proxies_reads_no_header():
    assert client_address("127.0.0.1", (), ["for=192.0.2.60"], ["192.0.2.60"]) == "127.0.0.1"


def test_networks_are_checked():
    with pytest.raises(ValueError, match="'10.0.0.0/33' is not an IP address or CIDR block"):
        parse_networks(["10.0.0.0/33"])


@given(forwarded=st.lists(st.text(max_size=40), max_size=3), xff=st.lists(st.text(max_size=40), max_size=3))
def test_any_header_text_gives_an_ip_address(forwarded, xff):
    """Whatever the headers say, the answer is an address, never their text (nor a zone id's)."""
    address = client_address("127.0.0.1", PROXIES, forwarded, xff)
    assert str(ipaddress.ip_address(address)) == address and "%" not in address


def test_an_ipv4_client_of_a_dual_stack_listener_is_its_ipv4_address():
    """
    A tcp6 listener's socket gives IPv4 peers as ::ffff:a.b.c.d: each keeps
    its own count, and an IPv4 proxy named in trusted_proxies is one.
    """
    assert client_address("::ffff:192.0.2.7", ()) == "192.0.2.7"
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_key("::ffff:192.0.2.7") != address_key("::ffff:192.0.2.8")
    assert client_address("::ffff:127.0.0.1", PROXIES, [], ["192.0.2.60"]) == "192.0.2.60"
    assert client_address("127.0.0.1", PROXIES, ['for="[::ffff:192.0.2.60]"'], []) == "192.0.2.60"
    assert client_address("127.0.0.1", PROXIES, [], ["::ffff:10.1.2.3, ::ffff:192.0.2.60"]) == "192.0.2.60"
    assert address_key("2001:db8:cafe::17") == address_key("2001:db8:cafe::18") == "2001:db8:cafe::"


def test_the_request_address_is_unmapped():
    request = DummyRequest([b""])
    request.client = IPv6Address("TCP", "::ffff:192.0.2.7", 40000)
    assert client_address_of(request, ()) == "192.0.2.7"
    request.client = IPv6Address("TCP", "::ffff:127.0.0.1", 40000)
    request.requestHeaders.setRawHeaders(b"x-forwarded-for", [b"192.0.2.60"])
    assert client_address_of(request, PROXIES) == "192.0.2.60"


def test_a_trusted_proxy_written_mapped_into_ipv6_is_still_trusted():
    """Peers are given as IPv4 addresses, so an IPv4 block written as ::ffff:a.b.c.d/n is read as that block."""
    proxies = parse_networks(["::ffff:10.0.0.0/104", "::ffff:127.0.0.1"])
    assert proxies == parse_networks(["10.0.0.0/8", "127.0.0.1"])
    assert client_address("::ffff:10.0.0.1", proxies, [], ["203.0.113.9"]) == "203.0.113.9"
