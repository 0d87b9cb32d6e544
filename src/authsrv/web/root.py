"""
The site's root: exact paths of static documents answer from a dict lookup,
everything else goes to the Klein application.
"""

from __future__ import annotations

from twisted.web.resource import Resource

from authsrv.web.headers import json_body
from authsrv.web.internal import PREFIX

INTERNAL_PREFIX = (PREFIX + "/").encode()


class TooLarge(Resource):
    """413 for a body over the limit (L{authsrv.web.request.BoundedRequest})."""

    isLeaf = True

    def render(self, request):
        request.setHeader(b"connection", b"close")
        return json_body(
            request, 413, {"error": "invalid_request", "error_description": "the request body is too large"}
        )


class Root(Resource):
    """
    Dispatches on the whole request path before any routing, so discovery and
    JWKS cost one dict lookup (DESIGN.md, Speed targets).
    """

    def __init__(self, static: dict[bytes, Resource], app: Resource, internal: Resource | None = None):
        super().__init__()
        self._static = static
        self._app = app
        self._internal = internal

    def getChildWithDefault(self, name, request):
        if getattr(request, "body_too_large", False):
            return TooLarge()
        static = self._static.get(request.path)
        if static is not None:
            return static
        request.postpath.insert(0, request.prepath.pop())
        if self._internal is not None and request.path.startswith(INTERNAL_PREFIX):
            return self._internal
        return self._app
