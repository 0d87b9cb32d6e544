"""
Input and time limits on what one client may send (C{[limits]}): header
count and size, request line and query length, form fields, each OAuth
parameter's length, how long headers and a body may take to arrive, idle
keep-alive connections, and open connections per listener and per address.

Every refusal is a complete answer in the shape its endpoint uses (OAuth
JSON, the internal API's JSON, or an HTML page), never a 500 or a hang.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from http import HTTPStatus
from io import BytesIO

from twisted.internet.protocol import Protocol
from twisted.web.resource import Resource
from twisted.web import server
from twisted.web.server import Site

from authsrv.config import ISSUER_PATH, InputLimits
from authsrv.protocol.forwarded import address_key, is_trusted
from authsrv.web.channel import GatheringChannel, Outbox, socket_of, unsent_bytes
from authsrv.web.chunked import CappedChunkedDecoder, body_too_large
from authsrv.web.headers import allow_browser_clients, bodiless_head, json_body
from authsrv.web.pages import error_page
from authsrv.web.request import SERVER, BoundedRequest

INTERNAL_PREFIX = b"/api/internal/"
ADMIN_PREFIX = b"/api/admin/"
PAGE_PREFIXES = tuple(
    (ISSUER_PATH + p).encode() for p in (
        "/oauth2/authorize", "/oauth2/end-session", "/login", "/consent", "/link/", "/mfa", "/account", "/device",
    )
)
"""Browser pages: their refusals are HTML; everything else reads JSON."""
READ_BY_BROWSERS = (b"/.well-known/openid-configuration", *(
    (ISSUER_PATH + p).encode() for p in (
        "/.well-known/", "/jwks", "/oauth2/token", "/oauth2/par", "/oauth2/userinfo", "/oauth2/revoke",
        "/oauth2/register",
    )
))
"""
Endpoints that browser-based clients call from any origin: their refusals
carry the CORS headers their answers do, so such a client reads the error
rather than a failed fetch.
"""

SINGLETONS = (b"host", b"authorization", b"content-type")
"""
Headers a request carries once (RFC 9110 section 5.3, and RFC 9112 section
3.2 for Host): twisted.web reads the last of two, a proxy in front may check
the first, so two are refused.
"""
HOST = re.compile(rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::(?P<port>[0-9]{0,5}))?")
"""
A Host header's value (RFC 9112 section 3.2): uri-host and an optional
port, or nothing. The port is a TCP port, 65535 at most (L{_names_a_host}).
"""


@lru_cache(maxsize=64)
def _names_a_host(value: bytes) -> bool:
    """Whether C{value} is a L{HOST}; the same few recur, so a match costs a cache lookup."""
    match = HOST.fullmatch(value)
    return match is not None and int(match["port"] or 0) <= 65535

METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"PATCH", b"DELETE", b"OPTIONS")
"""
The methods some route serves. Methods are case-sensitive (RFC 9110
section 9.1), so "post" is none of them, though werkzeug's routing would
serve it as POST; any other method is refused with 501 (section 15.6.2).
"""
TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""
A method's syntax (RFC 9110 section 9.1): a token. Anything else before the
first space is a malformed request line, which twisted.web answers 400.
"""
VERSION = re.compile(rb" HTTP/[0-9]\.[0-9]")
"""
An HTTP-version's syntax, after its space (RFC 9112 section 2.3). A later
minor version of HTTP/1 (C{HTTP/1.2}) is served as HTTP/1.1, the highest
this server speaks (RFC 9110 section 2.5); another major version
(C{HTTP/2.0}, which the HTTP/2 connection preface names too) is answered
505 (RFC 9110 section 15.6.6) rather than twisted.web's 400 for a malformed
request line, which says the client wrote it wrong.
"""

HEAD_STARTS = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\r\n")
"""
The bytes a request may begin with: a method's (L{TOKEN}), or the line
ends of empty lines before it (RFC 9112 section 2.2). Any other (a TLS
handshake's 0x16, sent to a plain HTTP port) can begin no request, and
waited for the header timeout, the handshake's client with it.
"""

NOT_HTTP = "the request does not begin with a method, as an HTTP/1.1 request does (this port does not speak TLS)"

UNKNOWN_METHOD = "this server implements the methods " + ", ".join(m.decode() for m in METHODS[:-1]) + " and OPTIONS only"

FOLDED = "a header field line begins with a space or tab (folded onto the line before): send each field on one line"
"""
Obsolete line folding (RFC 9112 section 5.2), which a server may refuse or
unfold: twisted.web unfolded "Transfer-Encoding:" and " chunked" into a
chunked body, where a proxy that reads the lines as written frames no body
and sends that body as the next request. No client today folds a line, so
it is refused, as is white space before the first field (section 2.2).
"""

BARE_LF = "a line of the request ends in a bare LF: end each line of the request line and header fields with CRLF"
"""
RFC 9112 section 2.2 lets a server read a bare LF as a line's end or not;
twisted.web splits lines at CRLF only, so a head of bare LFs waited for the
header timeout. A proxy in front that reads LF as CRLF would frame such a
request otherwise than this server, so it is refused at once (as twisted.web
refuses a bare LF inside a line). In line mode a read leaves only the bytes
after the last CRLF, so an LF among them is bare: one look at that rest
(empty after a whole request, where only its emptiness is looked at) per read.
"""

MIN_TAKEN = 16 * 1024
"""
Bytes a client must take of a closing connection's unsent answer every
C{abortTimeout} seconds (about 1 KiB a second) to keep it (L{LimitedChannel.forceAbortClient}).
"""

TITLES = {
    400: "Bad request",
    408: "Too slow",
    413: "Request too large",
    414: "Address too long",
    429: "Too many connections",
    431: "Request headers too large",
    501: "Not implemented",
    503: "Try again later",
    505: "HTTP version not supported",
}


def _payload(path: bytes, status: int, description: str) -> dict:
    error = "temporarily_unavailable" if status == 503 else "invalid_request"
    if path.startswith(ADMIN_PREFIX):
        return {"error": "too_large" if status == 413 else error, "message": description}
    if path.startswith(INTERNAL_PREFIX):
        return {"error": error, "message": description}
    return {"error": error, "error_description": description}


def allow_browsers_at(request) -> None:
    """At an endpoint of L{READ_BY_BROWSERS}, the CORS headers its answers carry, on a refusal too."""
    if request.path.startswith(READ_BY_BROWSERS):
        allow_browser_clients(request)


PAGE_ADVICE = {413: " Go back, check what was pasted into the form's fields, and send it again."}
"""What a person whose browser sent a refused page request can do about it, by status."""


def render_refusal(request, status: int, description: str) -> bytes:
    """A refused request's answer, shaped for the endpoint it was sent to."""
    allow_browsers_at(request)
    if request.path.startswith(PAGE_PREFIXES):
        return error_page(request, status, TITLES.get(status, "Bad request"),
                          description[:1].upper() + description[1:] + "." + PAGE_ADVICE.get(status, ""))
    return json_body(request, status, _payload(request.path, status, description), no_store=True)


class Refused(Resource):
    """A leaf that answers every request with one refusal."""

    isLeaf = True

    def __init__(self, status: int, description: str, close: bool = False):
        super().__init__()
        self._status = status
        self._description = description
        self._close = close

    def render(self, request):
        if self._close:
            request.setHeader(b"connection", b"close")
            request.channel.persistent = False
        return bodiless_head(request, render_refusal(request, self._status, self._description))


def parameter_caps(limits: InputLimits) -> dict[bytes, tuple[str, int]]:
    """Each capped parameter by its name as a request carries it, with its name and cap, for L{parameter_problem}."""
    return {name.encode(): (name, cap) for name, cap in limits.parameters.items()}


def parameter_problem(args: dict[bytes, list[bytes]], max_fields: int, caps: dict[bytes, tuple[str, int]]) -> str | None:
    """
    What is wrong with a request's query and form parameters, or None: at
    most C{max_fields} of them, none longer than its cap (L{parameter_caps}).
    One step per parameter sent, not per parameter capped.
    """
    if sum(map(len, args.values())) > max_fields:
        return f"too many parameters (at most {max_fields})"
    for key, values in args.items():
        capped = caps.get(key)
        if capped is not None:
            name, cap = capped
            for value in values:
                if len(value.decode("utf-8", "replace")) > cap:
                    return f"parameter {name} is too long (at most {cap} characters)"
    return None


class _Answer:
    """Collects what L{render_refusal} sets, for an answer written before any request object can."""

    def __init__(self, path: bytes):
        self.path = path
        self.code = 400
        self.headers: dict[bytes, bytes] = {}

    def setResponseCode(self, code):
        self.code = code

    def setHeader(self, name, value):
        self.headers[name.lower()] = value


def raw_refusal(path: bytes, status: int, description: str, headers=(), *, head: bool = False) -> bytes:
    """
    A whole HTTP/1.1 response that closes the connection, for refusals
    below the request layer; it carries a C{Date} as every other answer
    does (RFC 9110 section 6.6.1), and no content for a C{head} request
    (section 9.3.2), whose client reads none.
    """
    answer = _Answer(path)
    body = render_refusal(answer, status, description)
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    for name, value in [*answer.headers.items(), *headers]:
        lines.append(name + b": " + value)
    lines += [b"server: " + SERVER, b"date: " + server.datetimeToString(),
              b"content-length: " + str(len(body)).encode(), b"connection: close", b"", b""]
    return b"\r\n".join(lines) + (b"" if head else body)


def _absolute_form(request_line: bytes) -> tuple[bytes, bytes] | None:
    """
    For a request line with an absolute-form target (C{POST http://host/path
    HTTP/1.1}, as a proxy sends it), which RFC 9112 section 3.2.2 says a
    server must accept and twisted.web's routing cannot read: the target's
    authority, and the line with the target made origin-form. None for any
    other line. Nothing the server builds reads the authority (nor the Host
    header): the issuer and every URL come from the configured public URL.
    """
    method, space, rest = request_line.partition(b" ")
    if rest[:1] == b"/" or not space:
        return None
    target, space, version = rest.partition(b" ")
    scheme, separator, after = target.partition(b"://")
    if not separator or scheme.lower() not in (b"http", b"https"):
        return None
    ends = [at for at in (after.find(b"/"), after.find(b"?")) if at >= 0]
    authority, path = (after[:min(ends)], after[min(ends):]) if ends else (after, b"")
    return authority, b"%s %s%s%s%s" % (method, b"" if path[:1] == b"/" else b"/", path, space, version)


def _names_a_target_host(authority: bytes) -> bool:
    """
    Whether an absolute-form target's C{authority} names a host, as a Host
    header does (L{HOST}), and not an empty one: RFC 9110 section 4.2.1
    says an http URI with an empty host must be rejected, section 4.2.4
    that one with userinfo (C{user@host}) be treated as an error.
    """
    return authority[:1] not in (b"", b":") and _names_a_host(authority)


def _target(request_line: bytes) -> bytes:
    """The request target of a request line, or as much of it as arrived."""
    parts = request_line.split(b" ", 2)
    return parts[1] if len(parts) > 1 else b""


class LimitedChannel(GatheringChannel):
    """
    A L{GatheringChannel} that refuses, in the endpoint's shape, a request line
    (414) or a header section (431) over the limits, and a client that takes
    longer than the limits to send its headers or body (408). Twisted's own
    idle timeout (C{timeOut}) closes idle keep-alive connections, on one
    delayed call per connection (L{setTimeout}); a connection it closes is
    aborted when its client does not take the last answer (L{loseConnection}).
    """

    limits = InputLimits()
    fixed_headers: tuple = ()
    _idle_call = None
    _lost = False
    _unsent: int | None = None

    def setTimeout(self, period):
        """
        Twisted's idle timeout (C{TimeoutMixin}) is turned off while each
        request is answered and on again after it, which cancelled a delayed
        call and made a new one for every request. Here turning it off only
        marks it (the call, should it come, does nothing) and turning it on
        pushes the same call along.
        """
        previous, self.timeOut = self.timeOut, period
        if period is not None:
            if self._idle_call is not None and self._idle_call.active():
                self._idle_call.reset(period)
            else:
                self._idle_call = self.callLater(period, self._idle_over)
        return previous

    def resetTimeout(self):
        if self.timeOut is not None and self._idle_call is not None and self._idle_call.active():
            self._idle_call.reset(self.timeOut)

    def _idle_over(self):
        self._idle_call = None
        if self.timeOut is not None:
            self.timeoutConnection()

    def connectionMade(self):
        self._peer = self._host = None
        self.MAX_LENGTH = max(self.limits.max_request_line, self.limits.max_header_bytes)
        self.maxHeaders = self.limits.max_header_count + 1
        self.totalHeadersSize = self.limits.max_request_line + self.limits.max_header_bytes + 2 * self.maxHeaders
        self._deadline = None
        self._waiting_for: str | None = None
        self._refused = False
        self._new_head()
        super().connectionMade()

    def getPeer(self):
        """
        The peer's address, asked of the transport once per connection
        (twisted.web's Request asks on every request: a syscall and an
        address object each time). Asked at the first request, not when the
        connection opens: behind a C{haproxy:} listener the address is the
        one the PROXY header carries, read only once that header arrived.
        """
        if self._peer is None:
            self._peer = self.transport.getPeer()
        return self._peer

    def getHost(self):
        """The local address, as L{getPeer}."""
        if self._host is None:
            self._host = self.transport.getHost()
        return self._host

    def _new_head(self):
        self._method = b""
        self._http_1_1 = False
        self._target = b""
        self._head_lines = 0
        self._header_count = 0
        self._header_bytes = 0

    def _start(self, seconds: int, what: str):
        """
        Refuse the request unless C{what} arrives within C{seconds}. One
        timer per connection is pushed along from request to request rather
        than a new one made and cancelled each time (pushing it later costs
        no step of the reactor's queue); stopping only forgets what it waits for.
        """
        self._waiting_for = what
        if self._deadline is not None and self._deadline.active():
            self._deadline.reset(seconds)
        else:
            self._deadline = self.callLater(seconds, self._too_slow)

    def _stop(self):
        self._waiting_for = None

    def _cancel_deadline(self):
        self._waiting_for = None
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _too_slow(self):
        self._deadline = None
        if self._waiting_for is not None:
            self._refuse(408, f"the request {self._waiting_for} did not arrive in time")

    def _refuse(self, status: int, description: str):
        """Answer C{status} and close, once: a body refused as it arrives may still be parsed on to a framing error."""
        if self._refused:
            return
        self._cancel_deadline()
        self._refused = True
        self._send_gathered()
        if self.transport is not None:
            self.transport.write(raw_refusal(self._target, status, description, self.fixed_headers,
                                             head=self._method == b"HEAD"))
        self.loseConnection()

    def _respondToBadRequestAndDisconnect(self):
        """
        twisted.web's answer to a request it cannot frame (a malformed
        request line, header field, length or chunk) is a bare 400 with no
        body: this one is in the endpoint's shape and says what is wrong.
        Once a request is whole (its head forgotten, L{allContentReceived}),
        twisted.web asks for it only for a multipart/form-data body it
        cannot parse, and the request names its own path.
        """
        if self._handlingRequest:
            request = self.requests[-1]
            self._method, self._target = request.method, request.path
            return self._refuse(400, "the request body is not well-formed multipart/form-data")
        self._refuse(400, "the request is not well-formed HTTP/1.1: check its request line, header fields,"
                          " Content-Length and chunked encoding")

    def dataReceived(self, data):
        """
        Start the header timer for the head this read begins (L{_head_begins}), unless
        parsing is paused for the client's unread answers (L{pauseProducing}):
        bytes a TLS read hands on after the pause wait unparsed, their head
        whole perhaps, and the timer starts when parsing resumes, or a
        client reading its answers slowly had its next requests refused 408.
        """
        if self._refused:
            return
        if self._waiting_for is None and self.line_mode and not (self._handlingRequest or self.paused):
            self._head_begins(data)
            if self._refused:
                return
        super().dataReceived(data)
        rest = self._buffer if self.line_mode else b""
        if rest and not (self._busyReceiving or self.paused or self._refused):
            if b"\n" in rest:
                self._refuse(400, BARE_LF)
            elif self._waiting_for is None and not self._handlingRequest:
                self._head_begins(rest)

    def _head_begins(self, data: bytes) -> None:
        """
        A head begins with C{data} (or with the next read, when it is
        empty): refuse it if it cannot begin a request (L{HEAD_STARTS}),
        else start its header timer. A head that begins after a request
        answered within the same read is timed from then (the rest that
        read leaves), not from the next read.
        """
        if data and self._head_lines == 0 and data[0] not in HEAD_STARTS:
            return self._refuse(400, NOT_HTTP)
        self._start(self.limits.header_timeout, "headers")

    def lineReceived(self, line):
        if self._head_lines == 0:
            if not line:
                return super().lineReceived(line)
            too_long = len(line) > self.limits.max_request_line  # as sent, before an absolute target is cut
            absolute = _absolute_form(line)
            if absolute is not None:
                authority, line = absolute
            target = _target(line)
            self._method = line.partition(b" ")[0]
            self._http_1_1 = line.endswith(b" HTTP/1.1")
            self._target, _, query = target.partition(b"?")
            if too_long:
                return self._refuse(414, f"the request line is too long (at most {self.limits.max_request_line} bytes)")
            if absolute is not None and not _names_a_target_host(authority):
                return self._refuse(400, "the request target names no host: http://, a name or address and an optional"
                                         " port, then the path")
            if not self._http_1_1 and not line.endswith(b" HTTP/1.0") and VERSION.fullmatch(line[-9:]):
                if line[-3:-2] != b"1":
                    return self._refuse(505, "this server speaks HTTP/1.1 and HTTP/1.0 only")
                line, self._http_1_1 = line[:-3] + b"1.1", True
            if self._method not in METHODS and TOKEN.fullmatch(self._method):
                return self._refuse(501, UNKNOWN_METHOD)
            if len(query) > self.limits.max_query_bytes:
                return self._refuse(414, f"the query string is too long (at most {self.limits.max_query_bytes} bytes)")
        elif line:
            if line[:1] in (b" ", b"\t"):
                return self._refuse(400, FOLDED)
            self._header_bytes += len(line)
            self._header_count += 1
            if self._header_count > self.limits.max_header_count:
                return self._refuse(431, f"too many header fields (at most {self.limits.max_header_count})")
            if self._header_bytes > self.limits.max_header_bytes:
                return self._refuse(431, f"the header section is too large (at most {self.limits.max_header_bytes} bytes)")
        self._head_lines += 1
        return super().lineReceived(line)

    def lineLengthExceeded(self, line):
        if self._head_lines == 0:
            request_line = line.split(b"\r\n", 1)[0]
            self._method = request_line.partition(b" ")[0]
            self._target = _target(request_line).partition(b"?")[0]
            return self._refuse(414, f"the request line is too long (at most {self.limits.max_request_line} bytes)")
        return self._refuse(431, f"the header section is too large (at most {self.limits.max_header_bytes} bytes)")

    def allHeadersReceived(self):
        self._stop()
        headers = self.requests[-1].requestHeaders
        host = headers.getRawHeaders(b"host", ())
        for name in SINGLETONS:
            if len(host if name == b"host" else headers.getRawHeaders(name, ())) > 1:
                return self._refuse(400, f"the {name.decode()} header is sent more than once")
        if not host:
            if self._http_1_1:
                return self._refuse(400, "an HTTP/1.1 request must name its host in a Host header")
        elif not _names_a_host(host[0]):
            return self._refuse(400, "the Host header names no host: a name or address, and an optional port")
        codings = headers.getRawHeaders(b"transfer-encoding")
        if codings is not None and (self.length is not None or len(codings) > 1):
            # twisted.web reads "identity" as no coding at all, and a second line after "chunked" not at all;
            # a request whose last coding is not chunked alone has no reliable length and must be refused
            # (RFC 9112 section 6.3), whatever its Content-Length.
            return self._respondToBadRequestAndDisconnect()
        max_body = getattr(self.requestFactory, "max_body", None)
        if max_body is not None and self.length is not None and self.length > max_body:
            # Refused before twisted.web answers "Expect: 100-continue" and before a byte of it is read.
            return self._refuse(413, body_too_large(max_body))
        if codings is not None and max_body is not None:
            self._transferDecoder = CappedChunkedDecoder(self.requests[-1].handleContentChunk, self._finishRequestBody,
                                                         max_body, self._refuse)
        super().allHeadersReceived()
        if self.length != 0 and not self._refused:
            self._start(self.limits.body_timeout, "body")

    def _finishRequestBody(self, data):
        """
        Refuse a chunked body whose trailer fields hold a bare LF
        (L{BARE_LF}): twisted.web ends trailer lines at CRLF alone, so a
        proxy in front that ends them at LF ended the body there and sent
        what followed as the next request, which twisted.web read as more
        trailer fields: that request was left unanswered, and every answer
        after it given to the request before. Only a chunked body has trailers.
        """
        if any(b"\n" in line for line in getattr(self._transferDecoder, "_trailerHeaders", ())):
            return self._refuse(400, BARE_LF)
        return super()._finishRequestBody(data)

    def allContentReceived(self):
        if self._refused:  # refused at its headers, a request without a body ends here
            return
        self._stop()
        self._new_head()
        super().allContentReceived()

    def loseConnection(self):
        """
        Close once what is written has been sent, and abort the connection
        when its client takes too little of it for C{abortTimeout} seconds
        (L{forceAbortClient}): a client that never reads would otherwise
        keep it, its unsent answers and its place under the connection caps
        for ever. twisted.web arms that abort only when the idle timeout
        closes a connection, not when an answer closes it (C{Connection:
        close}, HTTP/1.0) nor at a refusal.
        """
        super().loseConnection()
        connection = socket_of(self.transport)
        self._unsent = None if connection is None else unsent_bytes(connection)
        if self._abortingCall is None and not self._lost:
            self._abortingCall = self.callLater(self.abortTimeout, self.forceAbortClient)

    def forceAbortClient(self):
        """
        Abort a closing connection whose client took less than
        L{MIN_TAKEN} bytes of what is left (or all of it, when less is left)
        in the last C{abortTimeout} seconds; otherwise look again as long
        later. A client reading a large answer slowly still gets it whole,
        where one abort a fixed time after the close cut it off; one
        reading a byte now and then keeps the connection no longer than
        its answer's size at that pace allows. Once the socket holds all
        that is left, it is closed as plain TCP closes it, which lets it
        deliver the rest: over TLS, Twisted keeps it open until the client
        answers the close alert, and an abort would drop what it holds.
        """
        connection, before = socket_of(self.transport), self._unsent
        if connection is not None and before is not None:
            left = unsent_bytes(connection)
            if not left and not connection.disconnecting:
                self._abortingCall = None
                return connection.loseConnection()
            if left and before - left >= min(before, MIN_TAKEN):
                self._unsent = left
                self._abortingCall = self.callLater(self.abortTimeout, self.forceAbortClient)
                return None
        return super().forceAbortClient()

    def connectionLost(self, reason):
        self._lost = True
        self._cancel_deadline()
        if self._idle_call is not None and self._idle_call.active():
            self._idle_call.cancel()
        self._idle_call = None
        self.site.connection_closed(self)
        super().connectionLost(reason)


class _Refusal(Protocol):
    """Answers a connection over a cap at once and closes it."""

    def __init__(self, status: int, description: str, headers):
        self._response = raw_refusal(b"", status, description, headers)

    def connectionMade(self):
        self.transport.write(self._response)
        self.transport.loseConnection()


class LimitedSite(Site):
    """
    A L{Site} with L{LimitedChannel}s, caps on its open connections (per
    listener, since each listener gets its own site, and per client
    address, trusted proxies excepted: everyone comes through them),
    headers on every response, and an optional access log. Its requests
    are L{BoundedRequest}s (by default, or of a C{requestFactory} made by
    L{authsrv.web.request.bounded_request_factory}).
    """

    protocol = LimitedChannel  # type: ignore[assignment]  # Twisted types it as HTTPChannel's own factory

    def __init__(self, resource, *, limits: InputLimits, access_log=None, headers=(), trusted_proxies=(),
                 **kwargs):
        kwargs.setdefault("requestFactory", BoundedRequest)
        super().__init__(resource, timeout=limits.idle_timeout, **kwargs)
        self.limits = limits
        self._trusted_proxies = trusted_proxies
        self.fixed_headers = tuple(headers)
        self._access_log = access_log
        self._outbox = Outbox(self.reactor.callLater)
        self.open_connections = 0
        self._by_address: Counter = Counter()

    def acceptableProtocols(self):
        """
        HTTP/1.1 alone for TLS's ALPN: twisted.web's Site offers h2 too where
        the h2 package is installed, which a L{LimitedChannel} cannot speak.
        """
        return [b"http/1.1"]

    def getContentFile(self, length):
        """
        Where a request's body is kept: in memory, since the site's
        L{BoundedRequest}s keep no more than their C{max_body} of it.
        Twisted asks the site for this first; without it, each request
        raised and caught an AttributeError, and a body of no announced
        length went to a temporary file.
        """
        return BytesIO()

    def log(self, request):
        """A line in the access log (an L{authsrv.web.accesslog.AccessLog}) unless it is off."""
        if self._access_log is not None:
            self._access_log(request, self._logDateTime)

    def buildProtocol(self, addr):
        host = getattr(addr, "host", None)
        address = None if host is None else address_key(host)  # an IPv6 host counts by its /64, as everywhere
        if self.limits.max_connections and self.open_connections >= self.limits.max_connections:
            return _Refusal(503, "the server has too many open connections; try again", (*self.fixed_headers, (b"retry-after", b"1")))
        if (
            address is not None
            and self.limits.max_connections_per_address
            and not is_trusted(host, self._trusted_proxies)
            and self._by_address[address] >= self.limits.max_connections_per_address
        ):
            return _Refusal(429, "too many open connections from this address", self.fixed_headers)
        channel = super().buildProtocol(addr)
        channel.limits = self.limits
        channel.fixed_headers = self.fixed_headers
        channel.outbox = self._outbox
        channel.address = address
        self.open_connections += 1
        self._by_address[address] += 1
        return channel

    def connection_closed(self, channel) -> None:
        self.open_connections -= 1
        self._by_address[channel.address] -= 1
        if self._by_address[channel.address] <= 0:
            del self._by_address[channel.address]
