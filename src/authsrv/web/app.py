"""
The Klein application: thin routes that hand work to flows and render their
results. Collaborators come in through the constructor; no module-level state.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from attrs import evolve
from twisted.cred.portal import Portal
from twisted.logger import Logger
from werkzeug.exceptions import MethodNotAllowed, NotFound

from authsrv.chat.tokens import linked_chat_user_id
from authsrv.flows import backchannel
from authsrv.flows.clients import ClientCache
from authsrv.flows.throttle import LoginThrottle
from authsrv.identity.errors import BackendUnavailable
from authsrv.identity.realm import UserRealm
from authsrv.protocol.errors import OAuthError, TemporarilyUnavailable
from authsrv.store.errors import StoreUnavailable
from authsrv.web.cookies import Cookies
from authsrv.web.headers import allow_any_origin, json_body, oauth_error
from authsrv.web.pages import error_page
from authsrv.web.routing import app

READINESS_TIMEOUT = 2.0
RETRY_AFTER = b"5"
JSON_ENDPOINTS = (b"/oauth2/token", b"/oauth2/userinfo", b"/oauth2/introspect", b"/oauth2/revoke")
"""Paths whose callers read JSON; every other route that uses the store is a page."""


class AuthServer:
    """
    Every route's collaborators. Route handlers live in the C{routes_*}
    modules, registered on the shared L{app}.
    """

    app = app
    log = Logger()

    def __init__(self, *, reactor, config, store, keystore, identity, readiness, chat_link=None):
        self.reactor = reactor
        self.config = config
        self.limits = config.limits
        self.issuer = config.issuer
        self.store = store
        self.clients = ClientCache(store, reactor)
        self.keystore = keystore
        self.identity = identity
        self.portal = Portal(UserRealm(identity), [identity])
        self.cookies = Cookies(
            path=urlsplit(config.issuer).path or "/", secure=config.issuer.startswith("https:")
        )
        self._readiness = readiness
        self.throttle = LoginThrottle()
        self.backchannel = backchannel.BackchannelNotifier(reactor, backchannel.default_http_client(reactor))
        self.chat_link = chat_link
        self._chat_provider = config.chat.provider if config.chat else None

    async def claims_user(self, user):
        """
        The user as tokens and UserInfo describe them: a chat account linked
        at this service wins over the one the identity backend knows.
        """
        if self._chat_provider is None:
            return user
        return evolve(user, chat_user_id=await linked_chat_user_id(self.store, user, self._chat_provider))

    def now(self) -> int:
        return int(self.reactor.seconds())

    def resource(self):
        return self.app.resource()

    @app.route("/.well-known/openid-configuration", methods=["GET", "HEAD"])
    def root_discovery(self, request):
        """The contract's redirect from the host root to the issuer's document."""
        allow_any_origin(request)
        request.setResponseCode(301)
        request.setHeader(b"location", f"{self.issuer}/.well-known/openid-configuration".encode())
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
                await self.store.ping().addTimeout(READINESS_TIMEOUT, self.reactor)
            except Exception as e:
                self.log.warn("readiness: store unreachable: {error}", error=str(e) or type(e).__name__)
                problem = "store unreachable"
        if problem:
            return json_body(request, 503, {"status": "unavailable", "reason": problem})
        return json_body(request, 200, {"status": "ready"})

    @app.handle_errors(OAuthError)
    def oauth_failure(self, request, failure):
        """Any OAuth error a JSON endpoint raised, rendered per RFC 6749 section 5.2."""
        return oauth_error(request, failure.value)

    @app.handle_errors(StoreUnavailable)
    def store_unavailable(self, request, failure):
        """The store is down or too slow: 503 and a retry hint, never a 500 or a hang."""
        self.log.warn("store unavailable: {error}", error=str(failure.value))
        return self._try_later(request, "the service cannot reach its database; try again")

    @app.handle_errors(BackendUnavailable)
    def identity_unavailable(self, request, failure):
        """
        No identity backend could say who the user is (a directory or
        database down) while checking their standing: 503 as for the store,
        never a 500, and never a refusal that would end their grant.
        """
        self.log.warn("identity backend unavailable: {error}", error=str(failure.value))
        return self._try_later(request, "the service cannot reach its user directory; try again")

    def _try_later(self, request, description: str) -> bytes:
        request.setHeader(b"retry-after", RETRY_AFTER)
        if request.path.endswith(JSON_ENDPOINTS):
            return oauth_error(request, TemporarilyUnavailable(description))
        return error_page(
            request, 503, "Try again later", "The service is temporarily unavailable; please try again in a moment."
        )

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


from authsrv.web import routes_logout  # noqa: E402,F401  (registers routes)
from authsrv.web import routes_interaction  # noqa: E402,F401  (registers routes)
from authsrv.web import routes_tokens  # noqa: E402,F401  (registers routes)
from authsrv.web import routes_link  # noqa: E402,F401  (registers routes)
