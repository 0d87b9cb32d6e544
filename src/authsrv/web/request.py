"""
The site's request class: bounded bodies, counted while in flight, the
headers every response carries (among them a generic C{Server} that names
no version), and, when metrics are on, one report per answered request.

Twisted reads a whole body before rendering; this request counts what
arrives and keeps none past the limit, so that an oversized body costs no
memory and is answered 413 (docs/design.md, Limits).
"""

from __future__ import annotations

from functools import lru_cache
from http import HTTPStatus
from time import perf_counter, time
from urllib.parse import unquote_to_bytes as unquote

from twisted.web import http, server
from twisted.web.http import RESPONSES
from twisted.web.server import Request

from authsrv.web.failures import oauth_server_error, unforeseen


def _remember_content_types() -> None:
    """
    Twisted parses every POST's Content-Type by building an email message,
    about a tenth of an introspection's CPU; the same few values recur, so a
    small LRU cache in front of that (private) parser pays for itself. It is
    looked up, never assumed: a Twisted without it just parses as before.
    """
    parse = getattr(http, "_parseContentType", None)
    if parse is not None and not hasattr(parse, "cache_info"):
        http._parseContentType = lru_cache(maxsize=64)(_unreadable_as_none(parse))


def _unreadable_as_none(parse):
    """
    C{parse}, with a Content-Type it raises on taken as naming no media
    type (no form is read from the body; the route says what it expects).
    The email parser refuses a value holding what Python reads as a line's
    end (a vertical tab, a form feed, NEL, the file separators), and the
    error rose out of the reactor: the client got no answer, the log a
    critical traceback for each such request.
    """
    def parsed(line: bytes) -> bytes:
        try:
            return parse(line)
        except ValueError:
            return b""

    return parsed


_remember_content_types()


def _multipart_failures_refused() -> None:
    """
    twisted.web's multipart/form-data reader raised errors other than its
    own for some bodies (a part named as RFC 2231 writes it, C{name*=},
    whose name the email package gives as a tuple): they rose out of the
    reactor, the client got no answer and the log a critical traceback.
    Each is the body's refusal, as the reader's own are (400, from
    L{authsrv.web.limits.LimitedChannel._respondToBadRequestAndDisconnect}).
    Looked up, never assumed, as L{_remember_content_types} does.
    """
    parse = getattr(http, "_getMultiPartArgs", None)
    refused = getattr(http, "_MultiPartParseException", None)
    if parse is None or refused is None or getattr(parse, "refuses_all", False):
        return

    def parsed(content: bytes, ctype: bytes):
        try:
            return parse(content, ctype)
        except refused:
            raise
        except Exception as e:
            raise refused(type(e).__name__) from None

    parsed.refuses_all = True  # type: ignore[attr-defined]
    http._getMultiPartArgs = parsed


_multipart_failures_refused()


def parse_query(text: bytes, keep_blank_values: bool = False) -> dict[bytes, list[bytes]]:
    """
    A query or form body's parameters, as twisted.web's C{parse_qs} reads
    them but with pairs separated by C{&} only (WHATWG URL, and Python's
    own since 3.9.2): a C{;} is data in a query (RFC 3986 section 3.4).
    twisted.web split at it too, so a client's state C{xyz;abc=1} came back
    as C{xyz}, and a parameter hidden after a C{;} reached the flows past a
    proxy that reads the query as written.
    """
    parameters: dict[bytes, list[bytes]] = {}
    for pair in text.split(b"&"):
        name, equals, value = pair.partition(b"=")
        if equals and (value or keep_blank_values):
            parameters.setdefault(unquote(name.replace(b"+", b" ")), []).append(unquote(value.replace(b"+", b" ")))
    return parameters


def _pairs_at_ampersands() -> None:
    """twisted.web's requests read their query and form body with L{parse_query}."""
    http.parse_qs = parse_query  # type: ignore[assignment]  # twisted.web passes two of parse_qs's three arguments


_pairs_at_ampersands()

SERVER = b"authsrv"
"""The C{Server} header of every response: Twisted's own names its version."""


class DateOfThisSecond:
    """
    Twisted's C{datetimeToString}, formatting the current time once a
    second rather than for every response's C{Date} header (the same text
    all second long); a given time is formatted as before.
    """

    def __init__(self, format_date, clock=time):
        self._format = format_date
        self._clock = clock
        self._second = -1
        self._text = b""

    def __call__(self, msSinceEpoch=None):
        if msSinceEpoch is not None:
            return self._format(msSinceEpoch)
        second = int(self._clock())
        if second != self._second:
            self._text, self._second = self._format(second), second
        return self._text


def _own_default_headers() -> None:
    """
    Twisted's Request sets the C{Server} (its version) and C{Date} headers
    of every response from two globals of its module: the name is ours
    (L{SERVER}), and the date is formatted once a second.
    """
    server.version = SERVER
    if not isinstance(server.datetimeToString, DateOfThisSecond):
        server.datetimeToString = DateOfThisSecond(server.datetimeToString)


_own_default_headers()


def _known_reason_phrases() -> None:
    """
    twisted.web's table of reason phrases lacks 429 and 431, so their
    status lines read "Unknown Status": they are filled in once, here,
    where a method of every request would cost each one.
    """
    for status in (HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE):
        RESPONSES.setdefault(status.value, status.phrase.encode())


_known_reason_phrases()


class BoundedRequest(Request):
    """
    A L{Request} that stops storing its body after C{max_body} bytes, is
    counted by C{drain} (an L{authsrv.drain.Drain}) from its first byte to
    its last, adds C{fixed_headers} to its response, and closes its
    connection after answering while the server drains. With C{metrics}
    (an L{authsrv.metrics.Metrics}) each answer is reported with its route
    (C{route}, set by L{authsrv.web.routes}), status and time since the
    whole request arrived.
    """

    max_body = 64 * 1024
    drain = None
    metrics = None
    fixed_headers: tuple[tuple[bytes, bytes], ...] = ()
    route: str | None = None
    started = 0.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.body_too_large = False
        self._received = 0
        self._counted = self.drain is not None
        if self._counted:
            self.drain.started()

    def process(self):
        if self.metrics is not None:
            self.started = perf_counter()
        for name, value in self.fixed_headers:
            self.setHeader(name, value)
        if self.drain is not None and self.drain.draining:
            self.setHeader(b"connection", b"close")
            self.channel.persistent = False
        super().process()

    def finish(self):
        """
        Counted before the answer is handed on: a lone answer leaves at
        once (L{authsrv.web.channel.Outbox}), and a scrape made after a
        client has its answer must find it counted.
        """
        first = not self.finished and not self._disconnected
        if first and self.metrics is not None:
            self.metrics.request_finished(self.route, self.code, perf_counter() - self.started)
        super().finish()
        if first:
            self._uncount()

    def connectionLost(self, reason):
        self._uncount()
        super().connectionLost(reason)

    def _uncount(self):
        """Ends the drain's count of this request, once, whether it was answered or its connection lost."""
        if self._counted:
            self._counted = False
            self.drain.ended()

    def processingFailed(self, reason):
        """
        A failure that reached Twisted itself, past every route's own
        handling (a prepared document whose source raised, say): logged and
        answered as an OAuth C{server_error}, never Twisted's HTML page. Once
        the response has started, there is no answer left to change.
        """
        if self.startedWriting:
            return super().processingFailed(reason)
        body = unforeseen(self, reason, oauth_server_error)
        self.setHeader(b"content-length", b"%d" % len(body))
        self.write(body)
        self.finish()
        return reason

    def gotLength(self, length):
        if length is not None and length > self.max_body:
            self.body_too_large = True
        super().gotLength(length)

    def handleContentChunk(self, data):
        """
        Keep the body up to C{max_body}; past it, the site's root answers
        413 when the request is whole. A L{authsrv.web.limits.LimitedChannel}
        refuses such a body before it arrives, by its Content-Length or its
        chunks' sizes (L{authsrv.web.chunked.CappedChunkedDecoder}).
        """
        self._received += len(data)
        if self._received > self.max_body:
            self.body_too_large = True
        if not self.body_too_large:
            super().handleContentChunk(data)


def bounded_request_factory(max_body: int, drain=None, fixed_headers=(), metrics=None) -> type[BoundedRequest]:
    return type(
        "BoundedRequest", (BoundedRequest,),
        {"max_body": max_body, "drain": drain, "fixed_headers": tuple(fixed_headers), "metrics": metrics},
    )
