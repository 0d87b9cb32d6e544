"""
The Klein application: thin routes that hand work to flows and render their
results. Collaborators come in through the constructor; no module-level state.
"""

from __future__ import annotations

from klein import Klein
from twisted.logger import Logger
from werkzeug.exceptions import MethodNotAllowed, NotFound

from authsrv.web.headers import allow_any_origin, json_body

READINESS_TIMEOUT = 2.0


class AuthServer:
    app = Klein()
    log = Logger()

    def __init__(self, *, reactor, issuer: str, store, readiness):
        self._reactor = reactor
        self._issuer = issuer
        self._store = store
        self._readiness = readiness

    def resource(self):
        return self.app.resource()

    @app.route("/.well-known/openid-configuration", methods=["GET", "HEAD"])
    def root_discovery(self, request):
        """The contract's redirect from the host root to the issuer's document."""
        allow_any_origin(request)
        request.setResponseCode(301)
        request.setHeader(b"location", f"{self._issuer}/.well-known/openid-configuration".encode())
        request.setHeader(b"cache-control", b"public, max-age=86400")
        return b""

    @app.route("/healthz", methods=["GET", "HEAD"])
    def liveness(self, request):
        """Alive: the process answers HTTP. Nothing else is checked."""
        request.setHeader(b"cache-control", b"no-store")
        return json_body(request, 200, {"status": "ok"})

    @app.route("/readyz", methods=["GET", "HEAD"])
    async def readiness(self, request):
        """
        Ready: start-up finished and the store answers within
        L{READINESS_TIMEOUT} seconds; a load balancer takes the instance out
        of rotation otherwise.
        """
        request.setHeader(b"cache-control", b"no-store")
        problem = self._readiness()
        if problem is None:
            try:
                await self._store.ping().addTimeout(READINESS_TIMEOUT, self._reactor)
            except Exception as e:
                self.log.warn("readiness: store unreachable: {error}", error=str(e) or type(e).__name__)
                problem = "store unreachable"
        if problem:
            return json_body(request, 503, {"status": "unavailable", "reason": problem})
        return json_body(request, 200, {"status": "ready"})

    @app.handle_errors(NotFound)
    def not_found(self, request, failure):
        return json_body(request, 404, {"error": "not_found", "error_description": "no such endpoint"})

    @app.handle_errors(MethodNotAllowed)
    def wrong_method(self, request, failure):
        allowed = ", ".join(failure.value.valid_methods or ())
        request.setHeader(b"allow", allowed.encode())
        return json_body(
            request, 405, {"error": "method_not_allowed", "error_description": f"use {allowed}"}
        )
