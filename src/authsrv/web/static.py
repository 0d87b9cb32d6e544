"""
Documents that change rarely (discovery, JWKS) served as ready bytes, below
Klein's router: no per-request serialization, ETag revalidation, and CORS for
any origin because browsers of every relying party fetch them.
"""

from __future__ import annotations

import hashlib
from typing import Callable

from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from authsrv.web.headers import allow_any_origin, bodiless_head, method_not_allowed


def _matches(etag: bytes, if_none_match: bytes | None) -> bool:
    """RFC 9110 section 13.1.2: C{*}, or any listed tag equal to C{etag} by weak comparison."""
    tags = [tag.strip() for tag in (if_none_match or b"").split(b",")]
    return b"*" in tags or any(tag.removeprefix(b"W/") == etag for tag in tags)


def _not_modified(request) -> int:
    """
    A 304, finished here: returned as an empty body, twisted.web would give
    it C{Content-Length: 0}, which RFC 9110 section 8.6 forbids (a 304's
    length, if any, is the 200's); finished without one, it has none.
    """
    request.setResponseCode(304)
    request.finish()
    return NOT_DONE_YET


class StaticBytes(Resource):
    """
    GET and HEAD of C{body()} (a callable, so a rotated JWKS is picked up;
    the ETag is recomputed only when the bytes object changes).
    """

    isLeaf = True

    def __init__(self, body: Callable[[], bytes], content_type: bytes, cache_control: bytes):
        super().__init__()
        self._body = body
        self._content_type = content_type
        self._cache_control = cache_control
        self._etag_of: tuple[bytes, bytes] = (b"", b"")

    def _etag(self, body: bytes) -> bytes:
        cached_body, etag = self._etag_of
        if cached_body is not body:
            etag = b'"' + hashlib.sha256(body).hexdigest()[:32].encode() + b'"'
            self._etag_of = (body, etag)
        return etag

    def render_GET(self, request):
        body = self._body()
        etag = self._etag(body)
        allow_any_origin(request)
        request.setHeader(b"content-type", self._content_type)
        request.setHeader(b"cache-control", self._cache_control)
        request.setHeader(b"etag", etag)
        if _matches(etag, request.getHeader(b"if-none-match")):
            return _not_modified(request)
        return body

    def render_HEAD(self, request):
        """GET's headers without its body (L{bodiless_head})."""
        answer = self.render_GET(request)
        return answer if answer is NOT_DONE_YET else bodiless_head(request, answer)

    def render_OPTIONS(self, request):
        allow_any_origin(request)
        request.setHeader(b"access-control-allow-methods", b"GET, HEAD, OPTIONS")
        request.setHeader(b"access-control-max-age", b"86400")
        request.setResponseCode(204)
        return b""

    def render(self, request):
        handler = {b"GET": self.render_GET, b"HEAD": self.render_HEAD, b"OPTIONS": self.render_OPTIONS}
        if request.method not in handler:
            allow_any_origin(request)
            return method_not_allowed(request, b"GET, HEAD, OPTIONS")
        return handler[request.method](request)
