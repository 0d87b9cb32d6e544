"""
Input and time limits, in memory: the site a listener gets, fed bytes over a
StringTransport with a Clock. Every refusal is a complete 4xx in the shape
of its endpoint, and the site keeps serving new connections afterwards.
"""

from __future__ import annotations

import json
import re
from http.client import HTTPResponse
from io import BytesIO
from pathlib import Path
from urllib.parse import urlencode

import pytest
from prometheus_client import CollectorRegistry, Counter
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import succeed
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import formatEvent
from twisted.protocols.haproxy import proxyEndpoint
from twisted.web.resource import Resource
from twisted.web.test.requesthelper import DummyChannel

from authsrv.config import PARAMETER_CAPS, InputLimits, parse_config
from authsrv.tls import endpoint_of
from authsrv.web.limits import LimitedSite
from authsrv.web.metrics import MetricsResource
from authsrv.web.request import BoundedRequest

from wire import BASE, Listener, parse, request_head

TOKEN = "/api/auth/oauth2/token"
AUTHORIZE = "/api/auth/oauth2/authorize"
INTERNAL = "/api/internal/user-access"


def form(path: str, fields) -> bytes:
    body = urlencode(fields).encode()
    head = request_head("POST", path, {"Content-Type": "application/x-www-form-urlencoded",
                                       "Content-Length": len(body)})
    return head + body


def assert_oauth(status, headers, body, expected_status, words):
    assert "date" in headers
    assert status == expected_status
    assert headers["content-type"] == "application/json"
    payload = json.loads(body)
    assert payload["error"] == "invalid_request" and words in payload["error_description"], payload


def assert_internal(status, headers, body, expected_status, words):
    assert "date" in headers
    assert status == expected_status
    payload = json.loads(body)
    assert payload["error"] == "invalid_request" and words in payload["message"], payload
    assert "error_description" not in payload


def assert_page(status, headers, body, expected_status, words):
    assert "date" in headers
    assert status == expected_status
    assert headers["content-type"].startswith("text/html")
    assert b"<!DOCTYPE html>" in body and words.encode() in body.lower()
    assert "content-security-policy" in headers


def test_too_many_header_fields_get_431_in_the_token_endpoint_shape():
    listener = Listener({"max_header_count": 20})
    head = request_head("POST", TOKEN, {f"X-Filler-{n}": "x" for n in range(21)})
    protocol, transport = listener.send(head)
    assert_oauth(*parse(transport), 431, "too many header fields")
    assert transport.disconnecting
    listener.assert_serves()


def test_a_header_section_over_the_size_limit_gets_431_as_a_page():
    listener = Listener({"max_header_bytes": 2048})
    head = request_head("GET", AUTHORIZE + "?client_id=x", {f"X-Filler-{n}": "y" * 200 for n in range(11)})
    _, transport = listener.send(head)
    assert_page(*parse(transport), 431, "header section is too large")
    assert transport.disconnecting
    listener.assert_serves()


def test_one_header_line_longer_than_any_limit_gets_431():
    listener = Listener()
    _, transport = listener.send(b"POST " + TOKEN.encode() + b" HTTP/1.1\r\nX-Big: " + b"z" * 20000)
    assert_oauth(*parse(transport), 431, "header section is too large")
    listener.assert_serves()


@pytest.mark.parametrize("head, check", [
    (request_head("POST", TOKEN, {"Content-Length": "12abc"}), assert_oauth),
    (request_head("POST", TOKEN, {"Transfer-Encoding": "chunked"}) + b"zz\r\n", assert_oauth),
    (request_head("POST", INTERNAL, {"Content-Length": "-1"}), assert_internal),
    (request_head("POST", "/api/internals", {"Content-Length": "-1"}), assert_oauth),
    (b"GET " + AUTHORIZE.encode() + b" HTTP/1.1\r\nno colon here\r\n\r\n", assert_page),
])
def test_a_request_twisted_web_cannot_frame_gets_400_in_the_endpoints_shape(head, check):
    listener = Listener()
    protocol, transport = listener.send(head)
    check(*parse(transport), 400, "not well-formed")
    assert transport.disconnecting
    listener.assert_serves()


@pytest.mark.parametrize("body", [
    b"no boundary here",
    b"--XX\r\nContent-Disposition: form-data; name*=utf-8''grant%5Ftype\r\n\r\nx\r\n--XX--\r\n",
], ids=["no boundary", "a name as RFC 2231 writes it"])
@pytest.mark.parametrize("path, check", [(TOKEN, assert_oauth), ("/api/auth/login", assert_page)])
def test_a_multipart_body_twisted_web_cannot_parse_gets_400_in_the_endpoints_shape(body, path, check):
    """
    twisted.web parses it once the request is whole, when its target was
    forgotten: the answer was JSON. A part named as RFC 2231 writes it
    (C{name*=}) made its reader raise out of the reactor: no answer.
    """
    listener = Listener()
    head = request_head("POST", path, {"Content-Type": "multipart/form-data; boundary=XX", "Content-Length": len(body)})
    _, transport = listener.send(head + body)
    check(*parse(transport), 400, "not well-formed multipart/form-data")
    assert transport.disconnecting
    listener.assert_serves()


@pytest.mark.parametrize("control", ["\x0b", "\x0c", "\x1c", "\x85"])
@pytest.mark.parametrize("path, check, words", [(TOKEN, assert_oauth, "grant_type is required"),
                                               ("/api/auth/login", assert_page, "sign-in ended")])
def test_a_content_type_python_reads_as_two_lines_reads_no_form_and_is_answered(control, path, check, words):
    """
    twisted.web parses a POST's Content-Type with the email package, which
    raises on what Python reads as a line's end: the error rose out of the
    reactor, the client had no answer and the log a critical traceback.
    """
    listener = Listener()
    body = b"grant_type=client_credentials"
    head = request_head("POST", path, {"Content-Type": f"application/x-www-form-urlencoded;{control}charset=utf-8",
                                       "Content-Length": len(body)})
    _, transport = listener.send(head + body)
    check(*parse(transport), 400, words)
    listener.assert_serves()


@pytest.mark.parametrize("head, status", [
    (b"HEAD /healthz HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (request_head("HEAD", "/healthz", {f"X-{n}": "v" for n in range(200)}), 431),
])
def test_a_refused_head_request_gets_no_body(head, status):
    """RFC 9110 section 9.3.2: an answer to HEAD carries no content, a refusal's neither."""
    listener = Listener()
    _, transport = listener.send(head)
    written = transport.value()
    assert written.startswith(f"HTTP/1.1 {status} ".encode()) and b"\r\ncontent-length: " in written
    assert written.endswith(b"\r\n\r\n"), written
    assert transport.disconnecting
    listener.assert_serves()


@pytest.mark.parametrize("method, path, check", [
    (b"post", "/api/auth/oauth2/revoke", assert_oauth),
    (b"Get", "/api/auth/account", assert_page),
    (b"TRACE", INTERNAL, assert_internal),
    (b"CONNECT", "127.0.0.1:22", assert_oauth),
])
def test_a_method_no_route_implements_gets_501(method, path, check):
    """
    Methods are case-sensitive (RFC 9110 section 9.1): Klein's routes served
    "post" as POST, past any proxy rule written for POST, while the leaves
    below Klein refused it; an unknown method gets 501 (section 15.6.2).
    """
    listener = Listener()
    _, transport = listener.send(method + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    check(*parse(transport), 501, "implements the methods")
    assert transport.disconnecting
    listener.assert_serves()


@pytest.mark.parametrize("line", [b"GET\t/api/auth/jwks HTTP/1.1", b"GET\x00 /api/auth/jwks HTTP/1.1",
                                  b"G(E)T /api/auth/jwks HTTP/1.1"])
def test_a_request_line_whose_method_is_no_token_is_malformed_not_unknown(line):
    """
    RFC 9112 section 3: the method is a token, then one space. "GET<TAB>/"
    is no method a server could implement but a malformed request line
    (400), not "this server implements GET ... only" (501), which tells a
    client that sent GET nothing it can act on.
    """
    listener = Listener()
    _, transport = listener.send(line + b"\r\nHost: x\r\n\r\n")
    assert_oauth(*parse(transport), 400, "check its request line")
    listener.assert_serves()


@pytest.mark.parametrize("line", [b"GET /healthz HTTP/2.0", b"PRI * HTTP/2.0", b"GET /healthz HTTP/0.9"])
def test_a_request_of_an_http_major_version_other_than_1_gets_505(line):
    """
    RFC 9110 section 15.6.6; the HTTP/2 connection preface (C{PRI * HTTP/2.0})
    was answered 501 for its method, other versions 400 as malformed.
    """
    listener = Listener()
    _, transport = listener.send(line + b"\r\nHost: x\r\n\r\n" + (b"SM\r\n\r\n" if line.startswith(b"PRI") else b""))
    status, headers, body = parse(transport)
    assert (status, json.loads(body)["error_description"]) == (505, "this server speaks HTTP/1.1 and HTTP/1.0 only")
    assert transport.disconnecting
    listener.assert_serves()


def test_a_later_minor_version_of_http_1_is_served_as_http_1_1():
    """RFC 9110 section 2.5: served as the highest minor version the server speaks, keeping the connection."""
    listener = Listener()
    _, transport = listener.send(b"GET /healthz HTTP/1.2\r\nHost: x\r\n\r\n")
    status, headers, body = parse(transport)
    assert status == 200 and transport.value().startswith(b"HTTP/1.1 200 ")
    assert not transport.disconnecting


@pytest.mark.parametrize("version", [b" HTTP/3", b" HTTP/1.10", b" http/1.1", b" HTTP/01.1", b"HTTP/2.0"])
def test_a_malformed_http_version_stays_a_malformed_request(version):
    listener = Listener()
    _, transport = listener.send(b"GET /api/auth/jwks" + version + b"\r\nHost: x\r\n\r\n")
    assert_oauth(*parse(transport), 400, "not well-formed HTTP/1.1")


TLS_CLIENT_HELLO = bytes.fromhex("16030100a5010000a10303") + bytes(32) + bytes.fromhex("0000021301010000")


@pytest.mark.parametrize("kept", [False, True], ids=["first", "after a request"])
def test_a_tls_handshake_sent_to_the_plain_port_is_refused_at_once(kept):
    """No request begins with a byte that is no method's: a ClientHello waited for the header timeout (408)."""
    listener = Listener()
    first = request_head("GET", "/healthz") if kept else b""
    protocol, transport = listener.send(first + TLS_CLIENT_HELLO)
    assert re.findall(rb"HTTP/1.1 (\d+) ", transport.value()) == [b"200", b"400"][1 - kept:]
    assert b"does not begin with a method" in transport.value() and transport.disconnecting
    listener.assert_serves()


@pytest.mark.parametrize("start", [b"\r\n", b""])
def test_a_request_after_one_empty_line_is_served(start):
    """RFC 9112 section 2.2: a server should ignore at least one empty line before a request line."""
    listener = Listener()
    _, transport = listener.send(start + request_head("GET", "/healthz"))
    assert parse(transport)[0] == 200


def test_a_request_line_too_long_gets_414_in_the_internal_shape():
    listener = Listener({"max_request_line": 1024, "max_query_bytes": 512})
    _, transport = listener.send(request_head("POST", INTERNAL + "/" + "a" * 1100))
    assert_internal(*parse(transport), 414, "request line is too long")
    listener.assert_serves()


def test_a_request_line_longer_than_the_line_buffer_gets_414():
    listener = Listener()
    _, transport = listener.send(b"GET " + AUTHORIZE.encode() + b"?state=" + b"s" * 40000)
    assert_page(*parse(transport), 414, "request line is too long")
    listener.assert_serves()


def test_a_query_too_long_gets_414():
    listener = Listener({"max_query_bytes": 1024})
    _, transport = listener.send(request_head("GET", AUTHORIZE + "?" + urlencode({"scope": "openid " * 300})))
    assert_page(*parse(transport), 414, "query string is too long")
    listener.assert_serves()


def test_too_many_form_fields_get_400():
    listener = Listener({"max_form_fields": 10})
    _, transport = listener.send(form(TOKEN, [(f"f{n}", "v") for n in range(11)]))
    assert_oauth(*parse(transport), 400, "too many parameters")
    listener.assert_serves()


@pytest.mark.parametrize("page", ["/mfa", "/mfa/enrol", "/account", "/account/password", "/device", "/consent"])
def test_a_page_refuses_too_many_fields_with_a_page(page):
    """A browser sees each form's refusal as a page, not as JSON."""
    listener = Listener({"max_form_fields": 10})
    _, transport = listener.send(form("/api/auth" + page, [(f"f{n}", "v") for n in range(11)]))
    assert_page(*parse(transport), 400, "too many parameters")
    listener.assert_serves()


def test_an_oversized_body_gets_413_and_the_connection_closes():
    listener = Listener({"max_body_bytes": 2048})
    protocol, transport = listener.send(form(TOKEN, {"grant_type": "x" * 3000}))
    assert_oauth(*parse(transport), 413, "body is too large")
    assert transport.disconnecting
    listener.assert_serves()


def test_a_sign_in_form_over_the_body_cap_tells_the_person_what_to_do():
    """A password pasted past the body cap (64 KiB by default) is a page saying to go back and check the field."""
    listener = Listener({"max_body_bytes": 2048})
    _, transport = listener.send(form("/api/auth/login", {"username": "alice", "password": "p" * 3000}))
    assert_page(*parse(transport), 413, "go back, check what was pasted into the form")
    listener.assert_serves()


def test_a_body_announced_too_large_is_refused_before_it_is_sent():
    """With Expect: 100-continue the client was told to send 100 MB, which was then read and thrown away."""
    listener = Listener({"max_body_bytes": 2048})
    head = request_head("POST", TOKEN, {"Content-Type": "application/x-www-form-urlencoded",
                                        "Content-Length": 100_000_000, "Expect": "100-continue"})
    _, transport = listener.send(head)
    assert b"100 Continue" not in transport.value()
    assert_oauth(*parse(transport), 413, "body is too large")
    assert transport.disconnecting
    listener.assert_serves()


@pytest.mark.parametrize("name", ["Authorization", "Content-Type", "Host"])
def test_a_header_sent_twice_that_a_request_carries_once_is_refused(name):
    """twisted.web reads the last of two, a proxy in front may check the first: they must not disagree."""
    listener = Listener()
    head = request_head("POST", INTERNAL, {"Content-Length": 0})
    line = f"{name}: one\r\n{name.lower()}: two\r\n".encode()
    _, transport = listener.send(head.replace(b"\r\n\r\n", b"\r\n" + line + b"\r\n", 1))
    assert_internal(*parse(transport), 400, f"{name.lower()} header is sent more than once")
    listener.assert_serves()


def test_an_http_1_1_request_without_host_is_refused():
    """RFC 9112 section 3.2: a server must answer 400 to an HTTP/1.1 request that lacks Host."""
    listener = Listener()
    _, transport = listener.send(b"GET /api/auth/jwks HTTP/1.1\r\nAccept: */*\r\n\r\n")
    assert_oauth(*parse(transport), 400, "must name its host in a Host header")
    assert transport.disconnecting
    _, transport = listener.send(b"GET /healthz HTTP/1.0\r\n\r\n")
    assert parse(transport)[0] == 200
    listener.assert_serves()


@pytest.mark.parametrize("host", ["a b", "x/y", "x@y", "[::1", "x:8o", "é.example", "x:65536", "x:000080", "x:1:2"])
def test_a_host_header_that_names_no_host_is_refused(host):
    """RFC 9112 section 3.2: 400 for a Host header with an invalid field value."""
    listener = Listener()
    head = b"GET /api/auth/jwks HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n"
    _, transport = listener.send(head)
    assert_oauth(*parse(transport), 400, "the Host header names no host")
    listener.assert_serves()


@pytest.mark.parametrize("host", ["", "id.example.com", "id.example.com:443", "127.0.0.1:8080", "[::1]:8080", "xn--d-x.example",
                                  "x:65535", "x:"])
def test_a_host_header_of_any_host_and_port_is_served(host):
    listener = Listener()
    _, transport = listener.send(b"GET /healthz HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
    assert parse(transport)[0] == 200


@pytest.mark.parametrize("coding", ["identity", "gzip", "chunked, identity"])
def test_a_transfer_coding_other_than_chunked_is_refused(coding):
    """
    RFC 9112 section 6.3: a request whose final transfer coding is not
    chunked has no length a server can rely on; it must be refused and the
    connection closed. twisted.web read "identity" as no body at all, and
    served the body as the next request, where a proxy in front may have
    read it as this one's body.
    """
    listener = Listener()
    smuggled = request_head("GET", "/healthz")
    head = request_head("POST", TOKEN, {"Content-Type": "application/x-www-form-urlencoded",
                                        "Transfer-Encoding": coding})
    _, transport = listener.send(head + smuggled)
    assert_oauth(*parse(transport), 400, "not well-formed")
    assert transport.value().count(b"HTTP/1.1 ") == 1
    assert transport.disconnecting
    head = request_head("POST", TOKEN, {"Transfer-Encoding": coding, "Content-Length": len(smuggled)})
    _, transport = listener.send(head + smuggled)
    assert_oauth(*parse(transport), 400, "not well-formed")
    listener.assert_serves()


def test_chunked_and_another_coding_on_two_lines_are_refused():
    """The lines make one list, chunked then identity: chunked is not the last, as on one line."""
    listener = Listener()
    head = request_head("POST", TOKEN, {"Transfer-Encoding": "chunked"})
    head = head.replace(b"\r\n\r\n", b"\r\nTransfer-Encoding: identity\r\n\r\n", 1)
    _, transport = listener.send(head + b"3\r\nabc\r\n0\r\n\r\n")
    assert_oauth(*parse(transport), 400, "not well-formed")
    assert transport.disconnecting
    listener.assert_serves()


@pytest.mark.parametrize("folded", [
    b"Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding:\r\n chunked\r\n",
    b"Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: \r\n\tchunked\r\n",
    b" Transfer-Encoding: chunked\r\n",
    b"Accept: text/html,\r\n application/json\r\n",
])
def test_a_folded_header_line_is_refused(folded):
    """
    RFC 9112 section 5.2 lets a server refuse obsolete line folding or
    unfold it; twisted.web unfolded "Transfer-Encoding:" and " chunked" into
    a chunked body, which a proxy that reads the lines as written (a
    header with no value, a line it drops) frames as no body, the body being
    the next request. A field line that begins with white space is refused,
    as is one before the first field (section 2.2).
    """
    listener = Listener()
    smuggled = request_head("GET", "/healthz")
    head = b"POST " + TOKEN.encode() + b" HTTP/1.1\r\nHost: x\r\n" + folded + b"\r\n"
    _, transport = listener.send(head + b"0\r\n\r\n" + smuggled)
    assert_oauth(*parse(transport), 400, "folded")
    assert transport.value().count(b"HTTP/1.1 ") == 1
    assert transport.disconnecting
    listener.assert_serves()


@pytest.mark.parametrize("lengths", [
    b"Content-Length: +12\r\n", b"Content-Length: 12, 12\r\n", b"Content-Length: 0x0c\r\n",
    b"Content-Length: 12\r\nContent-Length: 12\r\n", b"Content-Length: 12\r\nContent-Length: 0\r\n",
])
def test_a_content_length_not_one_number_is_refused_and_nothing_after_it_served(lengths):
    """
    RFC 9110 section 8.6 and RFC 9112 section 6.3: a length a proxy may read
    otherwise (a sign, a list, two lines) is refused, and the bytes after
    it are never read as a request of their own.
    """
    listener = Listener()
    head = b"POST " + TOKEN.encode() + b" HTTP/1.1\r\nHost: x\r\n" + lengths + b"\r\n"
    _, transport = listener.send(head + b"grant_type=x" + request_head("GET", "/healthz"))
    assert_oauth(*parse(transport), 400, "not well-formed")
    assert transport.value().count(b"HTTP/1.1 ") == 1
    assert transport.disconnecting
    listener.assert_serves()


def test_a_chunked_body_in_any_case_with_extensions_is_read_and_the_next_request_served_after_it():
    """
    Transfer codings are case-insensitive (RFC 9112 section 7) and a chunk
    extension is ignored (section 7.1.1): the body is this request's, and a
    request pipelined after it is answered as the second.
    """
    listener = Listener()
    head = request_head("POST", TOKEN, {"Content-Type": "application/x-www-form-urlencoded",
                                        "Transfer-Encoding": "Chunked"})
    _, transport = listener.send(head + b"c;name=value\r\ngrant_type=x\r\n0\r\n\r\n" + request_head("GET", "/healthz"))
    answers = transport.value()
    assert answers.count(b"HTTP/1.1 ") == 2, answers
    assert b"unsupported_grant_type" in answers.split(b"HTTP/1.1 200 ")[0]


def chunked_form(path: str, fields, chunk: int = 500) -> bytes:
    body = urlencode(fields).encode()
    head = request_head("POST", path, {"Content-Type": "application/x-www-form-urlencoded",
                                       "Transfer-Encoding": "chunked"})
    pieces = [b"%x\r\n%s\r\n" % (len(body[at:at + chunk]), body[at:at + chunk]) for at in range(0, len(body), chunk)]
    return head + b"".join(pieces) + b"0\r\n\r\n"


def test_a_body_of_no_announced_length_is_read_in_memory():
    listener = Listener()
    _, transport = listener.send(chunked_form(TOKEN, {"grant_type": "colour", "pad": "x" * 1500}))
    status, _, body = parse(transport)
    assert (status, json.loads(body)["error"]) == (400, "unsupported_grant_type")
    assert isinstance(listener.site.getContentFile(None), BytesIO)


def test_an_oversized_body_of_no_announced_length_gets_413():
    listener = Listener({"max_body_bytes": 2048})
    _, transport = listener.send(chunked_form(TOKEN, {"grant_type": "x" * 3000}))
    assert_oauth(*parse(transport), 413, "body is too large")
    listener.assert_serves()


def test_a_chunked_body_is_refused_once_it_passes_the_limit():
    """
    A body of no announced length was read, and thrown away, to its end
    (or to the body timeout, while the client kept sending), before its 413.
    """
    listener = Listener({"max_body_bytes": 2048})
    head = request_head("POST", TOKEN, {"Content-Type": "application/x-www-form-urlencoded",
                                        "Transfer-Encoding": "chunked"})
    protocol, transport = listener.send(head + b"800\r\n" + b"a" * 0x800 + b"\r\n")
    assert transport.value() == b""
    protocol.dataReceived(b"1\r\na")
    assert_oauth(*parse(transport), 413, "body is too large (at most 2048 bytes)")
    assert transport.disconnecting
    protocol.dataReceived(b"\r\n0\r\n\r\n")
    assert transport.value().count(b"HTTP/1.1") == 1
    listener.assert_serves()


def test_a_request_refused_mid_body_gets_one_answer_whatever_follows():
    listener = Listener({"max_body_bytes": 2048})
    head = request_head("POST", TOKEN, {"Transfer-Encoding": "chunked"})
    _, transport = listener.send(head + b"801\r\n" + b"a" * 0x801 + b"\r\nnot a chunk size\r\n")
    assert_oauth(*parse(transport), 413, "body is too large")
    assert transport.value().count(b"HTTP/1.1 ") == 1


def test_a_chunk_larger_than_the_limit_is_refused_as_it_arrives():
    listener = Listener({"max_body_bytes": 2048})
    head = request_head("POST", AUTHORIZE, {"Transfer-Encoding": "chunked"})
    _, transport = listener.send(head + b"ffffffffffff\r\n" + b"a" * 2049)
    assert_page(*parse(transport), 413, "body is too large")
    listener.assert_serves()


@pytest.mark.parametrize(("sizes", "status", "words"), [
    ([b"ffffffff"], 413, "body is too large (at most 2048 bytes)"),
    ([b"400", b"401"], 413, "body is too large (at most 2048 bytes)"),
    ([b"1" + b"0" * 16], 400, "more than 16 hex digits"),
    ([b"0" * 16 + b"1;ext=1"], 400, "more than 16 hex digits"),
], ids=["one chunk over", "two chunks over together", "too many digits", "too many digits before extension"])
def test_a_chunk_size_over_the_limit_is_refused_as_soon_as_it_is_announced(sizes, status, words):
    """
    A chunk size that takes the body past the limit, or has more digits
    than any size under it, was answered 408 at the body timeout: the
    client announcing it need send no more.
    """
    listener = Listener({"max_body_bytes": 2048})
    head = request_head("POST", TOKEN, {"Transfer-Encoding": "chunked"})
    chunks = b"".join(size + b"\r\n" + b"a" * int(size.partition(b";")[0], 16) + b"\r\n" for size in sizes[:-1])
    protocol, transport = listener.send(head + chunks + sizes[-1] + b"\r\n")
    assert_oauth(*parse(transport), status, words)
    assert transport.disconnecting
    protocol.dataReceived(b"a" * 100)
    assert transport.value().count(b"HTTP/1.1 ") == 1
    listener.assert_serves()


def test_a_chunk_size_of_sixteen_digits_within_the_limit_is_read():
    listener = Listener({"max_body_bytes": 2048})
    head = request_head("POST", TOKEN, {"Transfer-Encoding": "chunked",
                                        "Content-Type": "application/x-www-form-urlencoded"})
    _, transport = listener.send(head + b"0" * 14 + b"17\r\ngrant_type=nothing_real\r\n0\r\n\r\n")
    status, _, body = parse(transport)
    assert (status, json.loads(body)["error"]) == (400, "unsupported_grant_type")


CORS = {"access-control-allow-origin": "*", "access-control-expose-headers": "WWW-Authenticate, DPoP-Nonce, Retry-After"}


@pytest.mark.parametrize("request_bytes", [
    form(TOKEN, {"grant_type": "authorization_code", "code_verifier": "v" * 200}),
    form("/api/auth/oauth2/revoke", [(f"f{n}", "v") for n in range(100)]),
    form("/api/auth/oauth2/par", {"pad": "x" * 70000}),
    request_head("GET", "/api/auth/oauth2/userinfo?" + "a" * 7000),
    request_head("GET", "/api/auth/jwks", {f"X-Filler-{n}": "y" * 200 for n in range(90)}),
    request_head("POST", "/api/auth/oauth2/register", {"Content-Length": 100_000}),
    request_head("GET", "/.well-known/openid-configuration", {"Content-Length": "x"}),
], ids=["parameter too long", "too many fields", "body too large", "query too long", "headers too large",
        "body announced too large", "not well-formed"])
def test_a_refusal_at_an_endpoint_browsers_call_can_be_read_by_any_origin(request_bytes):
    """
    A single-page app reads the token endpoint's (and UserInfo's, ...)
    errors from any origin; a cap's refusal lacked the CORS headers, so the
    app saw only a failed fetch instead of the error.
    """
    listener = Listener()
    _, transport = listener.send(request_bytes)
    status, headers, _ = parse(transport)
    assert 400 <= status < 500
    assert {name: headers.get(name) for name in CORS} == CORS


@pytest.mark.parametrize("path", [INTERNAL, "/api/auth/oauth2/introspect", AUTHORIZE])
def test_a_refusal_elsewhere_allows_no_origin(path):
    listener = Listener()
    _, transport = listener.send(form(path, {"client_id": "c" * 1000}))
    status, headers, _ = parse(transport)
    assert status == 400 and "access-control-allow-origin" not in headers


def test_a_site_without_a_request_factory_bounds_its_bodies():
    assert issubclass(LimitedSite(Resource(), limits=InputLimits()).requestFactory, BoundedRequest)


@pytest.mark.parametrize("name", sorted(PARAMETER_CAPS))
def test_each_oauth_parameter_has_a_length_cap(name):
    listener = Listener()
    cap = PARAMETER_CAPS[name]
    _, transport = listener.send(request_head("GET", AUTHORIZE + "?" + urlencode({name: "a" * (cap + 1)})))
    assert_page(*parse(transport), 400, f"parameter {name} is too long")
    _, transport = listener.send(form(TOKEN, {name: "a" * (cap + 1)}))
    assert_oauth(*parse(transport), 400, f"parameter {name} is too long")
    _, transport = listener.send(form(TOKEN, {name: "a" * cap}))
    assert b"too long" not in parse(transport)[2]
    listener.assert_serves()


def test_parameter_caps_are_configurable():
    listener = Listener({"parameters": {"state": 64}})
    _, transport = listener.send(form(TOKEN, {"state": "s" * 65}))
    assert_oauth(*parse(transport), 400, "parameter state is too long (at most 64 characters)")


def test_headers_that_arrive_too_slowly_get_408():
    listener = Listener({"header_timeout": "10s"})
    protocol, transport = listener.connect()
    for piece in (b"POST " + TOKEN.encode() + b" HTTP/1.1\r\n", b"Host: 127.0.0.1\r\n", b"X-Slow: 1"):
        protocol.dataReceived(piece)
        listener.clock.advance(3)
        assert transport.value() == b""
    listener.clock.advance(1)
    assert_oauth(*parse(transport), 408, "headers did not arrive in time")
    assert transport.disconnecting
    listener.assert_serves()


def test_each_request_on_a_kept_connection_gets_its_own_header_deadline():
    listener = Listener({"header_timeout": "10s", "idle_timeout": "300s"})
    protocol, transport = listener.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert parse(transport)[0] == 200
    transport.clear()
    listener.clock.advance(50)
    assert transport.value() == b"" and not transport.disconnecting
    protocol.dataReceived(b"GET /healthz HTTP/1.1\r\n")
    listener.clock.advance(8)
    protocol.dataReceived(b"Host: x\r\n\r\n")
    assert parse(transport)[0] == 200
    transport.clear()
    listener.clock.advance(1)
    protocol.dataReceived(b"GET /healthz HTTP/1.1\r\n")
    listener.clock.advance(9.5)
    assert transport.value() == b"" and not transport.disconnecting
    listener.clock.advance(0.5)
    assert_oauth(*parse(transport), 408, "headers did not arrive in time")
    assert transport.disconnecting



@pytest.mark.parametrize("partial", [b"G", b"GET /healthz HTTP/1.1\r\nHo"])
def test_a_head_begun_in_the_read_that_ends_a_request_is_timed_from_then(partial):
    """Its header timer started only with the next read: a client sending nothing more kept it to the idle timeout."""
    listener = Listener({"header_timeout": "10s", "idle_timeout": "300s"})
    protocol, transport = listener.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + partial)
    assert parse(transport)[0] == 200
    transport.clear()
    listener.clock.advance(10)
    assert_oauth(*parse(transport), 408, "headers did not arrive in time")
    assert transport.disconnecting

def test_behind_a_proxy_protocol_listener_each_client_counts_by_the_address_its_header_carries():
    class Endpoint:
        def listen(self, factory):
            self.factory = factory
            return succeed(None)

    listener, endpoint = Listener(sections={"rate_limits": {"default": "1/s"}}), Endpoint()
    proxyEndpoint(endpoint).listen(listener.site)
    proxied = endpoint.factory
    proxy = IPv4Address("TCP", "10.0.0.9", 40000)

    def userinfo_from(source: str) -> int:
        protocol, transport = proxied.buildProtocol(proxy), StringTransport(peerAddress=proxy)
        protocol.makeConnection(transport)
        protocol.dataReceived(f"PROXY TCP4 {source} 10.0.0.5 56324 8080\r\n".encode())
        protocol.dataReceived(request_head("GET", "/api/auth/oauth2/userinfo"))
        return parse(transport)[0]

    assert userinfo_from("203.0.113.7") == 401
    assert userinfo_from("203.0.113.7") == 429
    assert userinfo_from("203.0.113.8") == 401


@pytest.mark.parametrize("header", [
    b"PROXY TCP4 not-an-ip 10.0.0.5 56324 8080", b"PROXY TCP4 a\x1b[31mb 10.0.0.5 56324 8080",
    b"PROXY TCP4 \xff\xfe 10.0.0.5 56324 8080", b"PROXY TCP4 203.0.113.07 10.0.0.5 56324 8080",
    b"PROXY TCP4 203.0.113.7 10.0.0.5 x 8080", b"PROXY TCP4 203.0.113.7 10.0.0.5 56324 65536",
    b"PROXY TCP4 203.0.113.7 10.0.0.5 56324 8080 more", b"PROXY TCP4 2001:db8::1 10.0.0.5 56324 8080",
    b"PROXY TCP6 zz:not ::1 56324 8080", b"PROXY TCP6 fe80::1%eth0 ::1 56324 8080",
])
def test_a_proxy_protocol_header_without_valid_addresses_and_ports_drops_the_connection(header, logged):
    """
    HAProxy's proxy-protocol.txt (section 2.1): a receiver drops a
    connection whose header has a field invalid or missing. Twisted's parser
    made any text the client's address (in the logs and rate-limit keys),
    and raised out of the reactor at a port that is no number.
    """
    reactor, listener = MemoryReactorClock(), Listener()
    endpoint_of(reactor, "server.listen[0]", "haproxy:tcp:8080:interface=10.0.0.5", Path(".")).listen(listener.site)
    proxied = reactor.tcpServers[0][1]
    proxy = IPv4Address("TCP", "10.0.0.9", 40000)

    def connect(data: bytes):
        protocol, transport = proxied.buildProtocol(proxy), StringTransport(peerAddress=proxy)
        protocol.makeConnection(transport)
        protocol.dataReceived(data)
        return protocol, transport

    _, transport = connect(header + b"\r\n" + request_head("GET", "/healthz"))
    assert transport.value() == b"" and transport.disconnecting
    dropped = [e for e in logged if e.get("log_namespace") == "authsrv.proxyheader"]
    assert len(dropped) == 1 and "10.0.0.9" in formatEvent(dropped[0]), dropped
    protocol, transport = connect(b"PROXY TCP4 203.0.113.7 10.0.0.5 56324 8080\r\n" + request_head("GET", "/healthz"))
    assert parse(transport)[0] == 200
    assert protocol.wrappedProtocol.getPeer().host == "203.0.113.7"


@pytest.mark.parametrize(("reads", "reason"), [
    ([request_head("GET", "/healthz")], "does not begin with a PROXY protocol header"),
    ([b"PRO", b"XY TCP4 203.0.113.7 10.0.0.5 56324 8080\r\n"], "of at least 8 bytes"),
    ([b"PROXY TCP4 " + b"1" * 120], "not a well-formed PROXY protocol header"),
])
def test_a_connection_dropped_without_a_readable_proxy_protocol_header_is_logged_once(reads, reason, logged):
    """
    A listener whose proxy sends no header (no C{send-proxy}) dropped every
    connection without a word in the log; it says why, once a connection.
    """
    reactor, listener = MemoryReactorClock(), Listener()
    endpoint_of(reactor, "server.listen[0]", "haproxy:tcp:8080:interface=10.0.0.5", Path(".")).listen(listener.site)
    proxy = IPv4Address("TCP", "10.0.0.9", 40000)
    protocol, transport = reactor.tcpServers[0][1].buildProtocol(proxy), StringTransport(peerAddress=proxy)
    protocol.makeConnection(transport)
    for data in reads:
        protocol.dataReceived(data)
    assert transport.value() == b"" and transport.disconnecting
    dropped = [formatEvent(e) for e in logged if e.get("log_namespace") == "authsrv.proxyheader"]
    assert len(dropped) == 1 and reason in dropped[0] and "10.0.0.9" in dropped[0], dropped


STALLED_V2 = b"\r\n\r\n\x00\r\nQUIT\n" + b"\x21\x11\xff\xff" + b"\xcb\x00\x71\x07"
"""A version 2 header announcing 65,535 bytes of addresses, of which it sends four."""


@pytest.mark.parametrize("stalled", [STALLED_V2, b"PROXY TCP4 203.0.113.7 10.0.0.5 56324"])
def test_a_proxy_protocol_header_that_stalls_is_dropped_at_the_header_timeout(stalled, logged):
    """
    A header that never completes held its connection until the idle
    timeout (60 s); it must arrive within [limits] header_timeout, as an
    HTTP request's headers must, and the drop is logged as other drops are.
    """
    reactor, listener = MemoryReactorClock(), Listener({"header_timeout": 5})
    endpoint_of(reactor, "server.listen[0]", "haproxy:tcp:8080:interface=10.0.0.5", Path(".")).listen(listener.site)
    proxy = IPv4Address("TCP", "10.0.0.9", 40000)

    def connect():
        protocol, transport = reactor.tcpServers[0][1].buildProtocol(proxy), StringTransport(peerAddress=proxy)
        protocol.makeConnection(transport)
        return protocol, transport

    protocol, transport = connect()
    protocol.dataReceived(stalled)
    reactor.advance(4.9)
    assert not transport.disconnecting
    reactor.advance(0.1)
    assert transport.disconnecting and transport.value() == b""
    dropped = [formatEvent(e) for e in logged if e.get("log_namespace") == "authsrv.proxyheader"]
    assert len(dropped) == 1 and "within 5 seconds" in dropped[0] and "10.0.0.9" in dropped[0], dropped

    protocol, transport = connect()
    protocol.dataReceived(b"PROXY TCP4 203.0.113.7 10.0.0.5 56324 8080\r\n")
    reactor.advance(60)
    assert not transport.disconnecting and not reactor.getDelayedCalls()
    protocol.dataReceived(request_head("GET", "/healthz"))
    assert parse(transport)[0] == 200


def test_connections_dropped_without_a_proxy_protocol_header_are_logged_once_a_minute(logged):
    """
    Anyone who reaches a C{haproxy:} listener can make it drop connections:
    each drop was a line in the log. One line a minute now says how many
    more were dropped since the last.
    """
    reactor, listener = MemoryReactorClock(), Listener()
    endpoint_of(reactor, "server.listen[0]", "haproxy:tcp:8080:interface=10.0.0.5", Path(".")).listen(listener.site)

    def drop(count: int) -> list[str]:
        for port in range(count):
            proxy = IPv4Address("TCP", "10.0.0.9", 40000 + port)
            protocol, transport = reactor.tcpServers[0][1].buildProtocol(proxy), StringTransport(peerAddress=proxy)
            protocol.makeConnection(transport)
            protocol.dataReceived(request_head("GET", "/healthz"))
            assert transport.disconnecting
        lines = [formatEvent(e) for e in logged if e.get("log_namespace") == "authsrv.proxyheader"]
        logged.clear()
        return lines

    first = drop(50)
    assert len(first) == 1 and "(0 more dropped since the last such line)" in first[0], first
    reactor.advance(59)
    assert drop(10) == []
    reactor.advance(1)
    later = drop(5)
    assert len(later) == 1 and "(59 more dropped since the last such line)" in later[0], later


UNIX_V2 = (b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x21, 0x31]) + (216).to_bytes(2, "big")
           + b"/run/client.sock".ljust(108, b"\x00") + b"/run/proxy.sock".ljust(108, b"\x00"))
"""A version 2 header of a connection the proxy took on a Unix socket (section 2.2, AF_UNIX, STREAM)."""


@pytest.mark.parametrize("header", [b"PROXY UNKNOWN\r\n", b"PROXY UNKNOWN ::1 ::1 1 2\r\n", UNIX_V2],
                         ids=["unknown", "unknown with fields", "v2 unix"])
def test_a_proxy_protocol_header_of_unknown_family_keeps_the_proxys_address(header):
    """
    proxy-protocol.txt (section 2.1): C{PROXY UNKNOWN} may end right there
    or carry anything up to the CRLF; either way the connection is served
    with the proxy's own address. Twisted's parser dropped the bare one.
    A Unix socket's path (version 2) is no client's address either: taken
    as one, every client the proxy took on that socket would share one
    rate-limit key, an address that is no address in the logs. Nor is it
    the address the client reached, which names a request without a Host
    header (HTTP/1.0, as HAProxy's default health check): that was a 500.
    """
    reactor, listener = MemoryReactorClock(), Listener()
    endpoint_of(reactor, "server.listen[0]", "haproxy:tcp:8080:interface=10.0.0.5", Path(".")).listen(listener.site)
    proxy = IPv4Address("TCP", "10.0.0.9", 40000)
    listening = IPv4Address("TCP", "10.0.0.5", 8080)
    protocol = reactor.tcpServers[0][1].buildProtocol(proxy)
    transport = StringTransport(peerAddress=proxy, hostAddress=listening)
    protocol.makeConnection(transport)
    protocol.dataReceived(header + request_head("GET", "/healthz") + b"GET /healthz HTTP/1.0\r\n\r\n")
    assert transport.value().count(b" 200 OK\r\n") == 2, "the second without a Host header, named by the listener"
    assert protocol.wrappedProtocol.getPeer().host == "10.0.0.9"
    assert protocol.wrappedProtocol.getHost().host == "10.0.0.5"


@pytest.mark.parametrize("head", [
    b"GET /api/auth/jwks HTTP/1.1\nHost: x\n\n", b"GET /api/auth/jwks HTTP/1.1\r\nHost: x\n\n",
    b"GET /api/auth/jwks HTTP/1.1\r\nHost: x\r\n\n", b"GET /api/auth/jwks HTTP/1.1\n",
])
def test_a_request_whose_lines_end_in_a_bare_lf_is_refused_at_once(head):
    """
    RFC 9112 section 2.2: a bare LF may end a line or not; a proxy in front
    may read it either way, so it is refused, at once rather than at the
    header timeout.
    """
    listener = Listener()
    _, transport = listener.send(head)
    assert_oauth(*parse(transport), 400, "bare LF")
    assert transport.disconnecting
    listener.assert_serves()


def test_a_chunked_body_whose_trailer_holds_a_bare_lf_is_refused_before_what_follows_is_read():
    """
    A proxy that ends a trailer line at LF ends the body at C{X: a\\n\\r\\n}
    and sends the next request; twisted.web, ending lines at CRLF alone,
    read that request as trailer fields: it went unanswered, and each
    answer after it went to the request before.
    """
    listener = Listener()
    body = b"grant_type=client_credentials"
    head = request_head("POST", TOKEN, {"Content-Type": "application/x-www-form-urlencoded",
                                        "Transfer-Encoding": "chunked"})
    _, transport = listener.send(head + b"%x\r\n%s\r\n0\r\nX: a\n\r\n" % (len(body), body)
                                 + request_head("GET", "/api/auth/jwks") + request_head("GET", "/healthz"))
    assert_oauth(*parse(transport), 400, "bare LF")
    assert transport.value().count(b"HTTP/1.1 ") == 1 and transport.disconnecting
    listener.assert_serves()


def test_a_head_whose_crlf_is_split_between_reads_is_served():
    listener = Listener()
    protocol, transport = listener.connect()
    for piece in (b"GET /healthz HTTP/1.1\r", b"\nHost: x\r", b"\n\r", b"\n" + request_head("GET", "/healthz")[:-1], b"\n"):
        protocol.dataReceived(piece)
    assert transport.value().count(b"HTTP/1.1 200 ") == 2
    assert not transport.disconnecting


def test_a_body_that_arrives_too_slowly_gets_408():
    listener = Listener({"body_timeout": "20s"})
    protocol, transport = listener.connect()
    protocol.dataReceived(request_head("POST", INTERNAL, {"Content-Type": "application/json", "Content-Length": 100}))
    for _ in range(19):
        protocol.dataReceived(b"{")
        listener.clock.advance(1)
    assert transport.value() == b""
    listener.clock.advance(1)
    assert_internal(*parse(transport), 408, "body did not arrive in time")
    listener.assert_serves()


def test_an_idle_keep_alive_connection_is_closed():
    listener = Listener({"idle_timeout": "30s"})
    protocol, transport = listener.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert parse(transport)[0] == 200
    listener.clock.advance(29)
    assert not transport.disconnecting
    listener.clock.advance(1)
    assert transport.disconnecting
    listener.assert_serves()


class SendBuffer(StringTransport):
    """A socket's write buffer as Twisted keeps it: past C{size} bytes unsent it pauses its producer, as a full one does."""

    size = 4096

    def write(self, data):
        super().write(data)
        if self.producer is not None and len(self.value()) > self.size:
            self.producer.pauseProducing()

    def drain(self, protocol) -> int:
        """The client reads all that was sent: the answers it got; the transport resumes its producer."""
        answers = self.value().count(b"HTTP/1.1 200 ")
        self.clear()
        protocol.resumeProducing()
        return answers


def test_a_client_that_reads_no_answers_gets_no_more_parsed_until_its_buffer_drains():
    listener = Listener()
    address = IPv4Address("TCP", "127.0.0.1", 40000)
    transport = SendBuffer(peerAddress=address)
    protocol = listener.site.buildProtocol(address)
    protocol.makeConnection(transport)
    protocol.dataReceived(b"GET /api/auth/jwks HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
    held = len(transport.value())
    assert held < 2 * SendBuffer.size and transport.producerState == "paused"
    answered = 0
    while answered < 200:
        got = transport.drain(protocol)
        assert 0 < got and len(transport.value()) < held + 2 * SendBuffer.size
        answered += got
    assert answered == 200 and transport.producerState == "producing"
    listener.close(protocol, transport)


@pytest.mark.parametrize("closing", [
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /healthz HTTP/1.0\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
])
def test_a_connection_the_server_closes_is_aborted_when_the_client_never_takes_the_answer(closing):
    listener = Listener({"idle_timeout": "300s", "header_timeout": "10s"})
    protocol, transport = listener.send(closing)
    if not transport.disconnecting:  # headers cut short: refused at the header timeout
        listener.clock.advance(10)
    assert parse(transport)[0] in (200, 408) and transport.disconnecting and not transport.disconnected
    listener.clock.advance(14)
    assert not transport.disconnected
    listener.clock.advance(1)
    assert transport.disconnected


def test_a_kept_connection_keeps_one_idle_timer_pushed_along_from_request_to_request():
    listener = Listener({"idle_timeout": "30s", "header_timeout": "25s"})
    protocol, transport = listener.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")

    def timers():
        return [call for call in listener.clock.getDelayedCalls() if getattr(call.func, "__self__", None) is protocol]

    first = timers()
    assert len(first) == 2
    for _ in range(3):
        listener.clock.advance(20)
        transport.clear()
        protocol.dataReceived(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert parse(transport)[0] == 200
        assert len(timers()) == 2 and all(any(timer is kept for kept in first) for timer in timers())
    listener.clock.advance(29)
    assert not transport.disconnecting
    listener.clock.advance(1)
    assert transport.disconnecting


def test_open_connections_are_capped_per_address():
    listener = Listener({"max_connections_per_address": 2})
    first, _ = listener.connect(), listener.connect()
    _, refused = listener.connect()
    status, headers, body = parse(refused)
    assert status == 429 and json.loads(body)["error"] == "invalid_request"
    assert refused.disconnecting
    other, _ = listener.connect(host="192.0.2.7")
    assert listener.site.open_connections == 3
    listener.close(*first)
    listener.assert_serves()


def test_an_ipv6_host_cannot_escape_the_connection_cap_by_changing_addresses():
    listener = Listener({"max_connections_per_address": 2})
    for n in (1, 2):
        protocol = listener.site.buildProtocol(IPv6Address("TCP", f"2001:db8:1:2::{n}", 40000))
        protocol.makeConnection(StringTransport(peerAddress=IPv6Address("TCP", f"2001:db8:1:2::{n}", 40000)))
    refused = listener.site.buildProtocol(IPv6Address("TCP", "2001:db8:1:2::99", 40000))
    transport = StringTransport()
    refused.makeConnection(transport)
    assert parse(transport)[0] == 429
    elsewhere = listener.site.buildProtocol(IPv6Address("TCP", "2001:db8:1:3::1", 40000))
    elsewhere.makeConnection(StringTransport())
    assert listener.site.open_connections == 3


def test_an_absolute_form_target_is_served_as_its_path():
    """RFC 9112 section 3.2.2: a server must accept POST http://host/path, as a proxy may send it."""
    listener = Listener()
    _, transport = listener.send(b"GET http://127.0.0.1:8080/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = parse(transport)
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    long_host = b"GET http://" + b"h" * 9000 + b"/healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    _, transport = Listener().send(long_host)
    assert parse(transport)[0] == 414, "the line is measured as it was sent"


@pytest.mark.parametrize("target", ["http://user@other.example/healthz", "http:///healthz", "http://:8080/healthz",
                                    "https://other.example:99999/healthz"])
def test_an_absolute_form_target_that_names_no_host_is_refused(target):
    """
    RFC 9110 section 4.2.1: an http URI with an empty host is invalid;
    section 4.2.4: one with userinfo is an error. Either was served as its path.
    """
    listener = Listener()
    _, transport = listener.send(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert_oauth(*parse(transport), 400, "the request target names no host")
    listener.assert_serves()


def test_an_absolute_form_target_changes_no_url_the_server_builds():
    """Its authority is checked, then ignored: the issuer and every URL come from the configured public URL."""
    listener = Listener()

    def get(path: str):
        target = "http://attacker.example:8443" + path
        _, transport = listener.send(f"GET {target} HTTP/1.1\r\nHost: other.example\r\n\r\n".encode())
        assert b"attacker" not in transport.value() and b"other.example" not in transport.value()
        return parse(transport)

    status, headers, _ = get("/.well-known/openid-configuration")
    assert (status, headers["location"]) == (301, BASE + "/api/auth/.well-known/openid-configuration")
    status, _, body = get("/api/auth/.well-known/openid-configuration")
    assert (status, json.loads(body)["issuer"]) == (200, BASE + "/api/auth")


def test_open_connections_are_capped_per_listener():
    listener = Listener({"max_connections": 2})
    first, _ = listener.connect(host="192.0.2.1"), listener.connect(host="192.0.2.2")
    _, refused = listener.connect(host="192.0.2.3")
    status, headers, body = parse(refused)
    assert (status, headers["retry-after"]) == (503, "1")
    assert json.loads(body)["error"] == "temporarily_unavailable"
    listener.close(*first)
    listener.assert_serves()


def test_a_request_within_every_limit_is_served():
    listener = Listener()
    _, transport = listener.send(request_head("GET", "/readyz", {f"X-Ok-{n}": "v" * 100 for n in range(50)}))
    assert parse(transport)[0] == 200


@pytest.mark.parametrize(
    "limits, problem",
    [
        ({"max_header_count": 5}, "limits.max_header_count: must be at least 10, not 5"),
        ({"header_timeout": 0}, "limits.header_timeout: must be longer than zero"),
        ({"max_query_bytes": 9000}, "limits.max_query_bytes: must not exceed max_request_line"),
        ({"parameters": {"colour": 5}}, "limits.parameters.colour: unknown key"),
        ({"max_connections": -1}, "limits.max_connections: must be at least 0, not -1"),
    ],
)
def test_limits_are_checked_in_the_config(limits, problem):
    from authsrv.configsection import ConfigError

    with pytest.raises(ConfigError) as raised:
        parse_config({"limits": limits}, None)
    assert str(raised.value) == problem


def test_a_status_twisted_web_has_no_phrase_for_gets_its_own():
    """twisted.web's status line read "429 Unknown Status"."""
    request = BoundedRequest(DummyChannel())
    for code, phrase in ((429, b"Too Many Requests"), (431, b"Request Header Fields Too Large"), (200, b"OK")):
        request.setResponseCode(code)
        assert request.code_message == phrase


def test_parameters_are_separated_by_ampersands_only():
    """
    A ';' is data in a query (RFC 3986 section 3.4) and in a form (WHATWG
    URL): twisted.web split pairs at it too, so a client's state "xyz;abc=1"
    came back as "xyz", and a parameter hidden after a ';' reached the flows
    past a proxy that reads the query as written.
    """
    request = BoundedRequest(DummyChannel())
    request.process = lambda: None
    request.requestHeaders.setRawHeaders(b"content-type", [b"application/x-www-form-urlencoded"])
    request.content = BytesIO()
    request.content.write(b"code=c;grant_type=x&scope=a+b%3B")
    request.requestReceived(b"POST", b"/cb?state=xyz;abc=1&nonce=n;&=;", b"HTTP/1.1")
    assert request.args == {
        b"state": [b"xyz;abc=1"], b"nonce": [b"n;"], b"": [b";"], b"code": [b"c;grant_type=x"], b"scope": [b"a b;"],
    }


def _head(transport) -> tuple[int, dict]:
    """The status and headers of the answer to a HEAD request, and that it carries no body."""
    class Sock:
        def makefile(self, mode):
            return BytesIO(transport.value())

    response = HTTPResponse(Sock(), method="HEAD")  # type: ignore[arg-type]
    response.begin()
    headers = {k.lower(): v for k, v in response.getheaders()}
    assert transport.value().endswith(b"\r\n\r\n")
    return response.status, headers


@pytest.mark.parametrize("target, status", [
    (f"{AUTHORIZE}?code=the-secret-code&state={'s' * 513}", 400),  # a parameter over its cap
    ("/%ff/x?id_token_hint=the-secret-code", 400),  # a path that is not UTF-8 text
])
def test_a_refused_head_request_logs_no_line_and_no_query(target, status, logged):
    """
    twisted.web logged a warning holding the whole request target, query
    and all, for every HEAD answered with a body: a refusal wrote a code or
    a whole ID token into the diagnostic log, one line per request.
    """
    listener = Listener()
    _, transport = listener.send(request_head("HEAD", target))
    answer_status, headers = _head(transport)
    assert answer_status == status and int(headers["content-length"]) > 0
    assert not [event for event in logged if "the-secret-code" in repr(event)]
    assert not [event for event in logged if "HEAD" in formatEvent(event)]


def test_a_head_request_for_metrics_logs_no_line(logged):
    registry = CollectorRegistry()
    Counter("authsrv_example", "A series, so that the answer has a body", registry=registry).inc()
    site = LimitedSite(MetricsResource(registry), limits=InputLimits())
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
    protocol = site.buildProtocol(transport.getPeer())
    protocol.makeConnection(transport)
    protocol.dataReceived(request_head("HEAD", "/metrics"))
    status, headers = _head(transport)
    assert status == 200 and headers["content-type"].startswith("text/plain") and int(headers["content-length"]) > 0
    assert not [event for event in logged if "HEAD" in formatEvent(event)]


def test_requests_held_unparsed_while_the_client_reads_slowly_are_not_refused_as_late():
    """
    The requests of a client whose answers fill its buffer are read but
    left unparsed (L{test_a_client_that_reads_no_answers_gets_no_more_parsed_until_its_buffer_drains});
    bytes that arrive meanwhile (a TLS read hands them on in several
    pieces) started the header timer, so a client still reading its
    answers, however steadily, had the rest of its requests refused 408 as
    if their headers had not arrived, and its connection closed.
    """
    listener = Listener({"header_timeout": "10s", "idle_timeout": "60s"})
    address = IPv4Address("TCP", "127.0.0.1", 40000)
    transport = SendBuffer(peerAddress=address)
    protocol = listener.site.buildProtocol(address)
    protocol.makeConnection(transport)
    head = b"GET /api/auth/jwks HTTP/1.1\r\nHost: x\r\n\r\n"
    protocol.dataReceived(head * 100)
    assert transport.producerState == "paused"
    protocol.dataReceived(head * 100)
    answered = 0
    while answered < 200:
        listener.clock.advance(11)
        assert b" 408 " not in transport.value()
        answered += transport.drain(protocol)
    assert answered == 200 and not transport.disconnecting
    listener.close(protocol, transport)
