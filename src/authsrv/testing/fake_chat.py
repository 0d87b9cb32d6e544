"""
A fake chat-platform OAuth 2 provider (Discord's endpoint shapes) for tests
and the example app.

It serves authorize (no UI: straight back to the redirect URI with a code,
or with C{error=access_denied} when C{deny} is set), token (the
authorization_code grant with PKCE S256, and refresh_token), RFC 7009
revocation and the current user. Two ways to reach it:

 - in memory: C{fake.memory_client()} is a L{treq.testing.StubTreq} to hand
   to L{authsrv.chat.provider.ChatProvider} as its HTTP client;
 - on a real port: C{fake.listen(reactor)} binds 127.0.0.1 on a free port
   and returns it; C{fake.endpoints(base_url)} are the C{[chat]} URLs.

Failure switches, changeable at any time: C{down} drops every connection
without an answer; C{unavailable} answers 503; C{not_json} answers an HTML
page with status 200 instead; C{oversized} pads every JSON answer to over a
mebibyte; C{slow} delays every answer by that many seconds
of the injected clock (C{held} is how many answers it is holding back now);
C{refuse_refresh} answers invalid_grant to refreshes; C{rotate_refresh} (on
by default) returns a new refresh token on each refresh and invalidates the
old one, and when off the answer carries none and the old one stays valid;
C{expires_in} is the lifetime of the access tokens it issues;
C{hold_revocations} leaves revocation requests without an answer;
C{user_unavailable} answers 503 at the current user's endpoint only, as a
platform whose API is partly down. C{refreshes}
counts the refreshes it served, C{exchanges} the codes it redeemed, and
C{revocations} lists the (token, token_type_hint) of each RFC 7009
revocation it honoured (the token then no longer works).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets

from attrs import frozen
from klein import Klein
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.web.server import Site

from authsrv.protocol.urls import with_query

AUTHORIZE_PATH = "/oauth2/authorize"
TOKEN_PATH = "/api/oauth2/token"
USER_PATH = "/api/users/@me"
REVOKE_PATH = "/api/oauth2/token/revoke"


@frozen
class FakeChatUser:
    id: str
    username: str


@frozen
class _Code:
    client_id: str
    redirect_uri: str
    scope: str
    challenge: str | None
    user: FakeChatUser


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def _first(request, name: bytes) -> str | None:
    values = request.args.get(name)
    return values[0].decode("utf-8", "replace") if values else None


class FakeChatProvider:
    """See the module docstring. C{user} is who approves the next authorization."""

    app = Klein()

    def __init__(self, clock, *, client_id: str = "fake-chat-client", client_secret: str = "fake-chat-secret",
                 user: FakeChatUser = FakeChatUser("80351110224678912", "alice"), expires_in: int = 604800):
        self.clock = clock
        self.client_id = client_id
        self.client_secret = client_secret
        self.user = user
        self.expires_in = expires_in
        self.down = False
        self.unavailable = False
        self.oversized = False
        self.not_json = False
        self.slow = 0
        self.held = 0
        self.refuse_refresh = False
        self.rotate_refresh = True
        self.deny = False
        self.hold_revocations = False
        self.user_unavailable = False
        self.revocations: list[tuple[str, str | None]] = []
        self.exchanges = 0
        self.refreshes = 0
        self._codes: dict[str, _Code] = {}
        self._access: dict[str, tuple[FakeChatUser, str, float]] = {}
        self._refresh: dict[str, tuple[FakeChatUser, str]] = {}
        self._flushes: list = []

    def resource(self):
        return self.app.resource()

    def memory_client(self) -> StubTreq:
        """An in-memory HTTP client reaching this fake; delayed answers are flushed to it."""
        client = StubTreq(self.resource())
        self._flushes.append(client.flush)
        return client

    def listen(self, reactor, port: int = 0):
        """Serve on 127.0.0.1 (a free port by default); returns the listening port."""
        return reactor.listenTCP(port, Site(self.resource()), interface="127.0.0.1")

    def endpoints(self, base_url: str) -> dict[str, str]:
        """The C{[chat]} keys that point authsrv at this fake, served at C{base_url}."""
        base = base_url.rstrip("/")
        return {
            "client_id": self.client_id,
            "authorize_url": base + AUTHORIZE_PATH,
            "token_url": base + TOKEN_PATH,
            "user_url": base + USER_PATH,
            "revocation_url": base + REVOKE_PATH,
        }

    def grant(self, scope: str = "identify guilds.join", user: FakeChatUser | None = None) -> dict:
        """A token response as a code exchange would give, without the browser round trip."""
        return self._issue(user or self.user, scope, with_refresh=True)

    def honour_refresh_token(self, refresh_token: str, user: FakeChatUser, scope: str = "identify guilds.join") -> None:
        """Accept a refresh token issued elsewhere (another server's stored link), as the platform would."""
        self._refresh[refresh_token] = (user, scope)

    def access_valid(self, access_token: str) -> bool:
        """Whether the fake would accept this access token now."""
        held = self._access.get(access_token)
        return held is not None and held[2] > self.clock.seconds()

    def tokens(self) -> list[str]:
        """Every access and refresh token it still honours, to look for in logs."""
        return [*self._access, *self._refresh]

    # --- the wire -----------------------------------------------------------------

    async def _serve(self, request, answer):
        """Apply the switches, then C{answer()}: (status, JSON body) or a redirect URL."""
        if self.down:
            request.transport.abortConnection()
            return await Deferred()
        if self.slow:
            self.held += 1
            try:
                await deferLater(self.clock, self.slow, lambda: None)
            finally:
                self.held -= 1
            self.clock.callLater(0, self._flush)
        if self.unavailable:
            return self._json(request, 503, {"message": "503: Service Unavailable", "code": 0})
        if self.not_json:
            request.setHeader(b"content-type", b"text/html; charset=utf-8")
            return b"<html><body>Down for maintenance</body></html>"
        result = answer()
        if isinstance(result, str):
            request.setResponseCode(302)
            request.setHeader(b"location", result.encode())
            return b""
        status, body = result
        if self.oversized:
            body = {**body, "padding": "x" * 1024 * 1024}
        return self._json(request, status, body)

    def _flush(self) -> None:
        for flush in self._flushes:
            flush()

    @staticmethod
    def _json(request, status: int, body: dict) -> bytes:
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        return json.dumps(body).encode()

    @app.route(AUTHORIZE_PATH, methods=["GET"])
    def authorize(self, request):
        return self._serve(request, lambda: self._authorize(request))

    @app.route(TOKEN_PATH, methods=["POST"])
    def token(self, request):
        return self._serve(request, lambda: self._token(request))

    @app.route(REVOKE_PATH, methods=["POST"])
    async def revoke(self, request):
        if self.hold_revocations:
            return await Deferred()
        return await self._serve(request, lambda: self._revoke(request))

    @app.route(USER_PATH, methods=["GET"])
    def current_user(self, request):
        return self._serve(request, lambda: self._current_user(request))

    def _authorize(self, request):
        redirect_uri = _first(request, b"redirect_uri")
        if _first(request, b"client_id") != self.client_id or not redirect_uri:
            return 400, {"error": "invalid_request", "error_description": "unknown client or no redirect_uri"}
        state = _first(request, b"state")
        back = {"state": state} if state is not None else {}
        if _first(request, b"response_type") != "code":
            return with_query(redirect_uri, {"error": "unsupported_response_type", **back})
        challenge = _first(request, b"code_challenge")
        if challenge is not None and _first(request, b"code_challenge_method") != "S256":
            return with_query(redirect_uri, {"error": "invalid_request", **back})
        if self.deny:
            return with_query(redirect_uri, {"error": "access_denied", "error_description": "denied", **back})
        code = secrets.token_urlsafe(24)
        scope = _first(request, b"scope") or "identify"
        self._codes[code] = _Code(self.client_id, redirect_uri, scope, challenge, self.user)
        return with_query(redirect_uri, {"code": code, **back})

    def _client_ok(self, request) -> bool:
        """client_secret_post or client_secret_basic."""
        client_id, secret = _first(request, b"client_id"), _first(request, b"client_secret")
        basic = request.getHeader(b"authorization") or b""
        if basic[:6].lower() == b"basic ":
            try:
                client_id, _, secret = base64.b64decode(basic[6:]).decode().partition(":")
            except ValueError:
                return False
        return client_id == self.client_id and secret is not None and hmac.compare_digest(
            secret.encode(), self.client_secret.encode()
        )

    def _token(self, request):
        if not self._client_ok(request):
            return 401, {"error": "invalid_client"}
        grant_type = _first(request, b"grant_type")
        if grant_type == "authorization_code":
            return self._redeem(request)
        if grant_type == "refresh_token":
            return self._refresh_grant(request)
        return 400, {"error": "unsupported_grant_type"}

    def _redeem(self, request):
        code = self._codes.pop(_first(request, b"code") or "", None)
        if code is None or code.redirect_uri != _first(request, b"redirect_uri"):
            return 400, {"error": "invalid_grant", "error_description": "unknown code or redirect_uri"}
        verifier = _first(request, b"code_verifier")
        if code.challenge is not None and (
            verifier is None or not hmac.compare_digest(_s256(verifier), code.challenge)
        ):
            return 400, {"error": "invalid_grant", "error_description": "PKCE verification failed"}
        self.exchanges += 1
        return 200, self._issue(code.user, code.scope, with_refresh=True)

    def _refresh_grant(self, request):
        token = _first(request, b"refresh_token") or ""
        held = self._refresh.get(token)
        if held is None or self.refuse_refresh:
            return 400, {"error": "invalid_grant", "error_description": "unknown or refused refresh token"}
        user, scope = held
        if self.rotate_refresh:
            del self._refresh[token]
        self.refreshes += 1
        return 200, self._issue(user, scope, with_refresh=self.rotate_refresh)

    def _issue(self, user: FakeChatUser, scope: str, *, with_refresh: bool) -> dict:
        access = secrets.token_urlsafe(24)
        self._access[access] = (user, scope, self.clock.seconds() + self.expires_in)
        body = {"access_token": access, "token_type": "Bearer", "expires_in": self.expires_in, "scope": scope}
        if with_refresh:
            refresh = secrets.token_urlsafe(24)
            self._refresh[refresh] = (user, scope)
            body["refresh_token"] = refresh
        return body

    def _revoke(self, request):
        """RFC 7009: 200 for any token, known or not, once the client is authenticated."""
        if not self._client_ok(request):
            return 401, {"error": "invalid_client"}
        token = _first(request, b"token")
        if token is None:
            return 400, {"error": "invalid_request"}
        self.revocations.append((token, _first(request, b"token_type_hint")))
        self._access.pop(token, None)
        self._refresh.pop(token, None)
        return 200, {}

    def _current_user(self, request):
        if self.user_unavailable:
            return 503, {"message": "503: Service Unavailable", "code": 0}
        header = request.getHeader(b"authorization") or b""
        token = header[7:].decode("ascii", "replace") if header[:7].lower() == b"bearer " else ""
        if not self.access_valid(token):
            return 401, {"message": "401: Unauthorized", "code": 0}
        user = self._access[token][0]
        return 200, {"id": user.id, "username": user.username}
