"""
The metrics listener's only resource: C{GET /metrics} in the Prometheus text
exposition format (OpenMetrics when the scraper asks for it), from the
server's own registry. Served on its own listener (C{[metrics] listen}),
never on the public site.
"""

from __future__ import annotations

from prometheus_client.exposition import choose_encoder
from twisted.web.resource import Resource

from authsrv.web.headers import bodiless_head, json_body, method_not_allowed

PATH = b"/metrics"


class MetricsResource(Resource):
    """Answers C{/metrics} from C{registry}; every other path is 404."""

    isLeaf = True

    def __init__(self, registry):
        super().__init__()
        self._registry = registry

    def render(self, request):
        return bodiless_head(request, self._answer(request))

    def _answer(self, request) -> bytes:
        if request.path != PATH:
            return json_body(request, 404, {"error": "not_found", "error_description": "only /metrics is served here"})
        if request.method not in (b"GET", b"HEAD"):
            return method_not_allowed(request, b"GET, HEAD")
        encode, content_type = choose_encoder((request.getHeader(b"accept") or b"").decode("latin-1"))
        request.setHeader(b"content-type", content_type.encode())
        request.setHeader(b"cache-control", b"no-store")
        return encode(self._registry)
