"""
The example first-party app: a small Klein relying party of authsrv that
does what a first-party app should with a relying-party session.

- Discovery: given only the server's public URL, the issuer is where its
  /.well-known/openid-configuration redirects to, so the app hard-codes
  neither a port nor a path of the server.
- Sign-in: authorization code flow with PKCE (S256) through discovery, with
  state, nonce and verifier kept server-side per attempt and bound to the
  browser; the callback checks state and iss (RFC 9207) and verifies the ID
  token against the JWKS.
- Tokens stay on the server; the browser holds only an opaque session id in
  an HttpOnly, SameSite=Lax cookie (Secure when the public URL is https).
- Every request to the protected page asks the internal user-access endpoint
  first, because a JWT access token cannot reflect a ban or a revoked grant.
- Tokens are refreshed near expiry, keeping the rotated refresh token.
- A "link chat account" button sends the browser to authsrv's link page,
  which signs the chat account to the user's authsrv session; chat-token
  then answers for it.
- Sign-out revokes the tokens, forgets the session and clears the cookie,
  then sends the browser through end-session.

Run beside the demo server, from the repository root:

    .venv/bin/twist authsrv --config examples/demo.toml
    .venv/bin/python examples/rp_app.py

or, with the server elsewhere, both told its public URL the same way:

    export AUTHSRV_PUBLIC_URL=http://127.0.0.1:9090
    .venv/bin/twist authsrv --config examples/demo.toml --listen tcp:9090:interface=127.0.0.1
    .venv/bin/python examples/rp_app.py
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import secrets
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import quote, urlencode, urlsplit

from jwcrypto import jwk, jwt
from jwcrypto.common import JWException
from klein import Klein
from treq.client import HTTPClient
from twisted.internet import error as net_error
from twisted.internet.defer import CancelledError, Deferred, DeferredLock, ensureDeferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.task import react
from twisted.logger import (
    FilteringLogObserver, LogLevel, LogLevelFilterPredicate, Logger, globalLogBeginner, textFileLogObserver,
)
from twisted.web.client import Agent, HTTPConnectionPool, ResponseFailed, ResponseNeverReceived
from twisted.web.resource import Resource
from twisted.web.server import Site
from twisted.web.template import Element, TagLoader, tags
from werkzeug.exceptions import MethodNotAllowed, NotFound

SCOPE = "openid profile email offline_access"
SESSION_COOKIE = "rp_session"
LOGIN_COOKIE = "rp_login"
ATTEMPT_TTL = 600
"""Seconds a sign-in attempt (and a sign-out's state) stays valid."""
MAX_PENDING = 10_000
"""Pending attempts kept at most, so that unfinished sign-ins cannot fill memory."""
JWKS_TTL = 600
"""Seconds the key set is cached: the server may publish a new key this long before using it."""
WELL_KNOWN = "/.well-known/openid-configuration"
REQUIRED_METADATA = (
    "issuer", "authorization_endpoint", "token_endpoint", "userinfo_endpoint",
    "jwks_uri", "end_session_endpoint", "revocation_endpoint",
)
NETWORK_ERRORS = (
    net_error.ConnectError, net_error.TimeoutError, CancelledError,
    ResponseFailed, ResponseNeverReceived,
)

log = Logger()


class Unavailable(Exception):
    """authsrv could not be reached, timed out, or answered something unusable."""


class Problem(Exception):
    """A request that ends in an error page with C{status}, C{title} and C{message}."""

    def __init__(self, status: int, title: str, message: str):
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


class TokenRefused(Exception):
    """The token endpoint answered an OAuth error; C{code} is its error code."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


@dataclass
class Attempt:
    """One sign-in attempt: what the callback needs, and the browser it belongs to."""

    browser: str = field(repr=False)
    nonce: str = field(repr=False)
    verifier: str = field(repr=False)
    expires_at: float


@dataclass
class SignedOut:
    """A sign-out on its way through end-session, recognised by its state on return."""

    expires_at: float


@dataclass
class Session:
    """A signed-in browser's tokens; only its id ever leaves the server."""

    sub: str
    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)
    id_token: str = field(repr=False)
    expires_at: float
    csrf: str = field(repr=False)
    refreshes: int = 0
    lock: DeferredLock = field(default_factory=DeferredLock, repr=False)


def read_secret(path: str, variable: str) -> str:
    """A secret from the environment variable when set, else from the file; never from argv."""
    value = os.environ.get(variable, "").strip()
    if value:
        return value
    try:
        with open(path, encoding="utf-8") as f:
            value = f.read().strip()
    except OSError as e:
        raise SystemExit(f"rp_app: cannot read a secret from {path}: {e.strerror}") from None
    if not value:
        raise SystemExit(f"rp_app: {path} is empty")
    return value


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def fingerprint(token: str) -> str:
    """A short digest that tells tokens apart on a page without revealing them."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def arg(request, name: str) -> str | None:
    """The first value of a query or form parameter, as text."""
    values = request.args.get(name.encode())
    return values[0].decode("utf-8", "replace") if values else None


def same(given: str, expected: str) -> bool:
    """Constant-time equality that also takes non-ASCII input (compare_digest refuses such str)."""
    return hmac.compare_digest(given.encode(), expected.encode())


def cookie(request, name: str) -> str | None:
    value = request.getCookie(name.encode())
    return value.decode("ascii", "replace") if value else None


def page(request, status: int, title: str, *body):
    """A tiny HTML page; twisted.web.template escapes every value put in it."""
    request.setResponseCode(status)
    return Element(TagLoader(tags.html(
        tags.head(tags.meta(charset="utf-8"), tags.title(title)),
        tags.body(tags.h1(title), *body),
        lang="en",
    )))


def redirect(request, location: str) -> bytes:
    request.setResponseCode(303)
    request.setHeader(b"location", location.encode())
    return b""


class Upstream:
    """Calls to authsrv with a whole-call timeout; JSON answers only."""

    def __init__(self, reactor, timeout: float):
        self._http = HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor)))
        self._timeout = timeout

    async def call(self, method: str, url: str, **kwargs) -> tuple[int, dict]:
        """The status and JSON object of the answer, or L{Unavailable}."""
        status, payload, _ = await self.fetch(method, url, **kwargs)
        return status, payload

    async def fetch(self, method: str, url: str, **kwargs) -> tuple[int, dict, str]:
        """As L{call}, and the URL that answered after redirects."""
        try:
            response = await self._http.request(method, url, timeout=self._timeout, **kwargs)
            body = await response.content()
        except NETWORK_ERRORS as e:
            raise Unavailable(f"{method} {url}: {e.__class__.__name__}") from None
        try:
            payload = json.loads(body) if body else {}
        except ValueError:
            raise Unavailable(f"{method} {url}: answered {response.code} without JSON") from None
        if not isinstance(payload, dict):
            raise Unavailable(f"{method} {url}: answered {response.code} with a non-object")
        return response.code, payload, response.request.absoluteURI.decode("ascii")


class Provider:
    """
    authsrv as seen by this client: its issuer and discovery document (kept
    once fetched, asked again on the next request while it fails), its keys,
    and the calls that need the client's credentials.
    """

    def __init__(self, reactor, upstream: Upstream, server: str, client_id: str, client_secret: str):
        self._reactor = reactor
        self._upstream = upstream
        self._server = server
        self.issuer: str | None = None
        self.client_id = client_id
        self._basic = b"Basic " + base64.b64encode(
            f"{quote(client_id, safe='')}:{quote(client_secret, safe='')}".encode()
        )
        self._metadata: dict | None = None
        self._keys: jwk.JWKSet | None = None
        self._keys_fetched = 0.0

    async def metadata(self) -> dict:
        """
        The server's root discovery URL redirects to the issuer's document;
        that document must name the issuer it was served under (OpenID
        Connect Discovery 1.0, section 4.3), on the server's own origin.
        """
        if self._metadata is None:
            status, document, served_at = await self._upstream.fetch(
                "GET", self._server + WELL_KNOWN)
            missing = [name for name in REQUIRED_METADATA if not isinstance(document.get(name), str)]
            if status != 200 or missing:
                raise Unavailable(f"discovery answered {status}, missing {', '.join(missing) or 'nothing'}")
            issuer = document["issuer"]
            if issuer + WELL_KNOWN != served_at or origin(issuer) != origin(self._server):
                raise Unavailable(f"discovery at {served_at} names issuer {issuer!r}")
            self.issuer = issuer
            self._metadata = document
        return self._metadata

    async def _keyset(self, renew: bool) -> jwk.JWKSet:
        now = self._reactor.seconds()
        if self._keys is None or renew or now - self._keys_fetched > JWKS_TTL:
            status, keys = await self._upstream.call("GET", (await self.metadata())["jwks_uri"])
            try:
                if status != 200:
                    raise ValueError(status)
                self._keys = jwk.JWKSet.from_json(json.dumps(keys))
            except (JWException, ValueError, TypeError):
                raise Unavailable(f"the JWKS answered {status} without a usable key set") from None
            self._keys_fetched = now
        return self._keys

    async def verify_id_token(self, token: str, nonce: str | None) -> dict:
        """
        The claims of an ID token signed by the issuer for this client and not
        expired (and carrying C{nonce} when given). An unknown key id fetches
        the key set again once, since the server may have rotated its keys.
        """
        metadata = await self.metadata()
        checks = {"iss": self.issuer, "aud": self.client_id, "exp": None, "sub": None}
        if nonce is not None:
            checks["nonce"] = nonce
        algs = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
        try:
            try:
                verified = jwt.JWT(jwt=token, key=await self._keyset(False), check_claims=checks, algs=algs)
            except jwt.JWTMissingKey:
                verified = jwt.JWT(jwt=token, key=await self._keyset(True), check_claims=checks, algs=algs)
            claims = json.loads(verified.claims)
        except (JWException, ValueError, TypeError) as e:
            raise Problem(502, "Sign-in failed", f"The ID token is not valid ({e.__class__.__name__}).") from None
        if not isinstance(claims, dict) or not isinstance(claims.get("sub"), str):
            raise Problem(502, "Sign-in failed", "The ID token names no user.")
        return claims

    async def token(self, form: dict) -> dict:
        """A token response, L{TokenRefused} for an OAuth error; client_secret_basic."""
        status, answer = await self._upstream.call(
            "POST", (await self.metadata())["token_endpoint"],
            data=form, headers={b"authorization": self._basic},
        )
        if status != 200:
            raise TokenRefused(str(answer.get("error") or f"status {status}"))
        if not isinstance(answer.get("access_token"), str) or not isinstance(answer.get("expires_in"), int):
            raise Unavailable("the token endpoint answered without access_token and expires_in")
        return answer

    async def revoke(self, token: str, hint: str) -> bool:
        status, _ = await self._upstream.call(
            "POST", (await self.metadata())["revocation_endpoint"],
            data={"token": token, "token_type_hint": hint}, headers={b"authorization": self._basic},
        )
        return status == 200

    async def userinfo(self, access_token: str) -> tuple[int, dict]:
        return await self._upstream.call(
            "GET", (await self.metadata())["userinfo_endpoint"],
            headers={b"authorization": b"Bearer " + access_token.encode()},
        )


class InternalAPI:
    """The first-party endpoints, on the issuer's origin, with the internal secret."""

    def __init__(self, upstream: Upstream, base: str, secret: str):
        self._upstream = upstream
        self._base = base
        self._auth = b"Bearer " + secret.encode()

    async def call(self, name: str, sub: str) -> tuple[int, dict]:
        return await self._upstream.call(
            "POST", f"{self._base}/api/internal/{name}",
            json={"userId": sub}, headers={b"authorization": self._auth},
        )


class App:
    """The relying party's routes and its in-memory state."""

    app = Klein()

    def __init__(self, reactor, provider: Provider, internal: InternalAPI, public_url: str, refresh_margin: int):
        self._reactor = reactor
        self._provider = provider
        self._internal = internal
        self._public_url = public_url
        self._secure = public_url.startswith("https://")
        self._refresh_margin = refresh_margin
        self._attempts: dict[str, Attempt] = {}
        self._sessions: dict[str, Session] = {}
        self._logouts: dict[str, SignedOut] = {}

    def resource(self):
        return self.app.resource()

    @property
    def _redirect_uri(self) -> str:
        return self._public_url + "/callback"

    def _now(self) -> float:
        return self._reactor.seconds()

    def _set_cookie(self, request, name: str, value: str, max_age: int | None = None) -> None:
        request.addCookie(
            name, value, path="/", httpOnly=True, secure=self._secure, sameSite="lax",
            max_age=None if max_age is None else str(max_age),
        )

    def _clear_cookie(self, request, name: str) -> None:
        request.addCookie(
            name, "", path="/", httpOnly=True, secure=self._secure, sameSite="lax",
            max_age="0", expires="Thu, 01 Jan 1970 00:00:00 GMT",
        )

    def _remember(self, table: dict, key: str, value) -> None:
        """Add to a table of pending entries, dropping expired and then the oldest."""
        now = self._now()
        for stale in [k for k, v in table.items() if v.expires_at < now]:
            del table[stale]
        while len(table) >= MAX_PENDING:
            del table[next(iter(table))]
        table[key] = value

    def _session(self, request) -> tuple[str | None, Session | None]:
        sid = cookie(request, SESSION_COOKIE)
        return sid, self._sessions.get(sid) if sid else None

    async def _end_session(self, request, sid: str) -> bool:
        """
        Forget the session, clear its cookie and revoke its tokens, so that
        they cannot outlive it (an unban would make them valid again); True
        when authsrv accepted every revocation.
        """
        session = self._sessions.pop(sid, None)
        self._clear_cookie(request, SESSION_COOKIE)
        return session is not None and await self._revoke(session)

    @app.route("/", methods=["GET"])
    async def home(self, request):
        """The protected page: served only while user-access says allowed."""
        sid, session = self._session(request)
        if session is None:
            state = arg(request, "state")
            signed_out = self._logouts.pop(state, None) if state else None
            if signed_out is not None and signed_out.expires_at >= self._now():
                return page(request, 200, "You are signed out",
                            tags.p("You signed out of the example app and of the sign-in service."),
                            tags.p(tags.a("Sign in again", href="/")))
            if sid:
                self._clear_cookie(request, SESSION_COOKIE)
            return await self._start_login(request)
        revoked = await self._access_refusal(session.sub)
        if revoked is not None:
            await self._end_session(request, sid)
            log.info("user {sub} no longer allowed; session dropped", sub=session.sub)
            return page(request, 403, "Your access was revoked", tags.p(revoked),
                        tags.p(tags.a("Sign in again", href="/")))
        await self._fresh(request, sid, session)
        status, profile = await self._provider.userinfo(session.access_token)
        if status != 200:
            await self._end_session(request, sid)
            raise Problem(401, "Your session ended",
                          f"The sign-in service refused this session's access token ({profile.get('error', status)}).")
        return page(
            request, 200, f"Hello, {profile.get('name') or session.sub}",
            tags.p("Email: ", tags.span(str(profile.get("email", "not shared")), id="email")),
            tags.h2("Session"),
            tags.p("Access token ", tags.code(fingerprint(session.access_token), id="access-token"),
                   " (a SHA-256 fingerprint) expires ", utc(session.expires_at),
                   "; refreshed ", tags.span(str(session.refreshes), id="refreshes"), " times."),
            tags.h2("Chat account"),
            await self._chat_panel(session.sub),
            tags.p(tags.a("Link chat account", href=f"{self._provider.issuer}/link/chat", id="link-chat")),
            tags.form(
                tags.input(type="hidden", name="csrf", value=session.csrf),
                tags.button("Sign out", type="submit"),
                method="post", action="/logout",
            ),
        )

    async def _access_refusal(self, sub: str) -> str | None:
        """None when user-access says allowed, else why not, in words for the user."""
        status, answer = await self._internal.call("user-access", sub)
        if status == 200 and answer.get("allowed") is True:
            return None
        if status == 200 and answer.get("banned") is True:
            return f"Your account is banned. Reason: {answer.get('banReason') or 'none given'}."
        if status == 200:
            return "Your sign-in to this app was revoked."
        if status == 404:
            return "Your account no longer exists."
        log.error("user-access answered {status} {error}", status=status, error=answer.get("error"))
        raise Problem(503, "Access cannot be checked", "The sign-in service did not confirm your access; try again later.")

    async def _fresh(self, request, sid: str, session: Session) -> None:
        """
        Refresh the tokens when the access token is near expiry; one refresh at
        a time per session, since a rotated refresh token works only once.
        """
        async with session.lock:
            if session.expires_at - self._now() > self._refresh_margin:
                return
            if session.refresh_token is None:
                await self._end_session(request, sid)
                raise Problem(401, "Your session ended", "The access token expired; please sign in again.")
            try:
                answer = await self._provider.token(
                    {"grant_type": "refresh_token", "refresh_token": session.refresh_token})
            except TokenRefused as e:
                await self._end_session(request, sid)
                log.info("refresh refused for {sub}: {code}", sub=session.sub, code=e.code)
                raise Problem(401, "Your session ended",
                              f"The sign-in service refused to renew it ({e.code}); please sign in again.") from None
            if isinstance(answer.get("id_token"), str):
                claims = await self._provider.verify_id_token(answer["id_token"], None)
                if claims["sub"] != session.sub:
                    await self._end_session(request, sid)
                    raise Problem(502, "Your session ended", "The renewed ID token names another user.")
                session.id_token = answer["id_token"]
            session.access_token = answer["access_token"]
            session.expires_at = self._now() + answer["expires_in"]
            if isinstance(answer.get("refresh_token"), str):
                session.refresh_token = answer["refresh_token"]
            session.refreshes += 1
            log.info("tokens refreshed for {sub}", sub=session.sub)

    async def _chat_panel(self, sub: str):
        """The chat-token call: its scope and expiry or its error code, never the token."""
        try:
            status, answer = await self._internal.call("chat-token", sub)
        except Unavailable:
            return tags.p("The chat token could not be fetched: the sign-in service did not answer.", id="chat")
        if status == 200:
            return tags.p("Linked. Token scope: ", tags.code(str(answer.get("scope"))),
                          "; expires ", str(answer.get("accessTokenExpiresAt")), ".", id="chat")
        return tags.p("No chat token: ", tags.code(str(answer.get("error", f"status {status}"))), id="chat")

    async def _start_login(self, request):
        """A new attempt with its own state, nonce and PKCE verifier; off to authorize."""
        metadata = await self._provider.metadata()
        browser = cookie(request, LOGIN_COOKIE) or secrets.token_urlsafe(32)
        attempt = Attempt(browser, secrets.token_urlsafe(32), secrets.token_urlsafe(32), self._now() + ATTEMPT_TTL)
        state = secrets.token_urlsafe(32)
        self._remember(self._attempts, state, attempt)
        self._set_cookie(request, LOGIN_COOKIE, browser, max_age=ATTEMPT_TTL)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(attempt.verifier.encode()).digest()).rstrip(b"=")
        query = urlencode({
            "response_type": "code",
            "client_id": self._provider.client_id,
            "redirect_uri": self._redirect_uri,
            "scope": SCOPE,
            "state": state,
            "nonce": attempt.nonce,
            "code_challenge": challenge.decode(),
            "code_challenge_method": "S256",
        })
        return redirect(request, f"{metadata['authorization_endpoint']}?{query}")

    @app.route("/callback", methods=["GET"])
    async def callback(self, request):
        """The authorization response: checked, then exchanged for a server-side session."""
        metadata = await self._provider.metadata()
        state = arg(request, "state")
        attempt = self._attempts.pop(state, None) if state else None
        browser = cookie(request, LOGIN_COOKIE) or ""
        if attempt is None or attempt.expires_at < self._now() or not same(browser, attempt.browser):
            raise Problem(400, "Sign-in failed", "This sign-in was not started here, expired or was already used.")
        iss = arg(request, "iss")
        if (iss is not None or metadata.get("authorization_response_iss_parameter_supported")) and iss != self._provider.issuer:
            raise Problem(400, "Sign-in failed", "The answer did not come from the expected sign-in service.")
        if arg(request, "error") is not None:
            raise Problem(400, "Sign-in did not complete", f"The sign-in service answered: {arg(request, 'error')}.")
        code = arg(request, "code")
        if not code:
            raise Problem(400, "Sign-in failed", "The answer carries no authorization code.")
        try:
            answer = await self._provider.token({
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": self._redirect_uri,
                "code_verifier": attempt.verifier,
            })
        except TokenRefused as e:
            raise Problem(400, "Sign-in failed", f"The code could not be exchanged ({e.code}).") from None
        if not isinstance(answer.get("id_token"), str):
            raise Problem(502, "Sign-in failed", "The sign-in service sent no ID token.")
        claims = await self._provider.verify_id_token(answer["id_token"], attempt.nonce)
        old_sid, _ = self._session(request)
        if old_sid:
            self._sessions.pop(old_sid, None)
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = Session(
            sub=claims["sub"],
            access_token=answer["access_token"],
            refresh_token=answer.get("refresh_token") if isinstance(answer.get("refresh_token"), str) else None,
            id_token=answer["id_token"],
            expires_at=self._now() + answer["expires_in"],
            csrf=secrets.token_urlsafe(32),
        )
        self._set_cookie(request, SESSION_COOKIE, sid)
        log.info("signed in {sub}", sub=claims["sub"])
        return redirect(request, "/")

    @app.route("/logout", methods=["POST"])
    async def logout(self, request):
        """Revoke, forget, clear the cookie, then end the session at authsrv too."""
        sid, session = self._session(request)
        if session is None:
            if sid:
                self._clear_cookie(request, SESSION_COOKIE)
            return page(request, 200, "You are signed out", tags.p(tags.a("Sign in", href="/")))
        if not same(arg(request, "csrf") or "", session.csrf):
            raise Problem(403, "Sign-out failed", "The sign-out form is out of date; go back, reload and try again.")
        metadata = await self._provider.metadata()
        revoked = await self._end_session(request, sid)
        state = secrets.token_urlsafe(32)
        self._remember(self._logouts, state, SignedOut(self._now() + ATTEMPT_TTL))
        end_session = metadata["end_session_endpoint"] + "?" + urlencode({
            "id_token_hint": session.id_token,
            "client_id": self._provider.client_id,
            "post_logout_redirect_uri": self._public_url + "/",
            "state": state,
        })
        log.info("signed out {sub}", sub=session.sub)
        if not revoked:
            return page(request, 502, "Signed out here only",
                        tags.p("This app forgot your session, but the sign-in service did not confirm "
                               "that your tokens were revoked."),
                        tags.p(tags.a("Continue signing out at the sign-in service", href=end_session)))
        return redirect(request, end_session)

    async def _revoke(self, session: Session) -> bool:
        """Revoke the refresh token (its whole grant) and the access token; True when both were accepted."""
        tokens = [(session.access_token, "access_token")]
        if session.refresh_token is not None:
            tokens.insert(0, (session.refresh_token, "refresh_token"))
        try:
            results = [await self._provider.revoke(token, hint) for token, hint in tokens]
        except Unavailable as e:
            log.warn("revocation failed: {why}", why=str(e))
            return False
        if not all(results):
            log.warn("revocation refused for {sub}", sub=session.sub)
        return all(results)

    @app.handle_errors(Problem)
    def problem(self, request, failure):
        e = failure.value
        return page(request, e.status, e.title, tags.p(e.message), tags.p(tags.a("Start again", href="/")))

    @app.handle_errors(Unavailable)
    def unavailable(self, request, failure):
        log.warn("authsrv unavailable: {why}", why=str(failure.value))
        return page(request, 503, "The sign-in service is unavailable",
                    tags.p("It could not be reached or gave an unusable answer. Please try again in a moment."),
                    tags.p(tags.a("Try again", href="/")))

    @app.handle_errors(NotFound)
    def not_found(self, request, failure):
        return page(request, 404, "Not found", tags.p(tags.a("Home", href="/")))

    @app.handle_errors(MethodNotAllowed)
    def wrong_method(self, request, failure):
        request.setHeader(b"allow", ", ".join(failure.value.valid_methods or ()).encode())
        return page(request, 405, "Method not allowed", tags.p(tags.a("Home", href="/")))

    @app.handle_errors(Exception)
    def unexpected(self, request, failure):
        log.failure("unexpected error", failure)
        return page(request, 500, "Something went wrong", tags.p("The error was logged."),
                    tags.p(tags.a("Home", href="/")))


class SecurityHeaders(Resource):
    """Wraps the Klein resource: pages are never cached, framed, or sent as a referrer."""

    isLeaf = True

    def __init__(self, wrapped, form_origins: str):
        super().__init__()
        self._wrapped = wrapped
        self._csp = f"default-src 'none'; form-action 'self' {form_origins}; frame-ancestors 'none'".encode()

    def render(self, request):
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"x-frame-options", b"DENY")
        request.setHeader(b"referrer-policy", b"no-referrer")
        request.setHeader(b"content-security-policy", self._csp)
        return self._wrapped.render(request)


def access_line(timestamp: str, request) -> str:
    """An access log line without the query: the callback's carries an authorization code."""
    path = request.path.decode("utf-8", "replace")
    return f'"{request.getClientAddress().host}" "{request.method.decode()} {path}" {request.code}'


def options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The example first-party app of authsrv.")
    parser.add_argument("--authsrv", default=os.environ.get("AUTHSRV_PUBLIC_URL") or "http://127.0.0.1:8080",
                        help="authsrv's public URL (default: AUTHSRV_PUBLIC_URL, else http://127.0.0.1:8080);"
                        " the issuer is read from its discovery document")
    parser.add_argument("--client-id", default="demo-app")
    parser.add_argument("--client-secret-file", default="examples/demo-secrets/demo-app",
                        help="read unless DEMO_APP_CLIENT_SECRET is set")
    parser.add_argument("--internal-secret-file", default="examples/demo-secrets/internal-api-secret",
                        help="read unless INTERNAL_API_SECRET is set")
    parser.add_argument("--listen", default="tcp:9000:interface=127.0.0.1", help="a Twisted endpoint string")
    parser.add_argument("--public-url", default="http://127.0.0.1:9000")
    parser.add_argument("--refresh-margin", type=int, default=60,
                        help="refresh when the access token expires within this many seconds")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for each call to authsrv")
    args = parser.parse_args(argv)
    args.authsrv = args.authsrv.rstrip("/")
    args.public_url = args.public_url.rstrip("/")
    for name in ("authsrv", "public_url"):
        if urlsplit(getattr(args, name)).scheme not in ("http", "https"):
            parser.error(f"--{name.replace('_', '-')} must be an http or https URL")
    if args.refresh_margin < 0:
        parser.error("--refresh-margin must not be negative")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    return args


async def run(reactor, argv: list[str]) -> None:
    args = options(argv)
    client_secret = read_secret(args.client_secret_file, "DEMO_APP_CLIENT_SECRET")
    internal_secret = read_secret(args.internal_secret_file, "INTERNAL_API_SECRET")
    quiet = LogLevelFilterPredicate(LogLevel.info)
    quiet.setLogLevelForNamespace("twisted.web.client._HTTP11ClientFactory", LogLevel.warn)
    globalLogBeginner.beginLoggingTo(
        [FilteringLogObserver(textFileLogObserver(sys.stdout), [quiet])], redirectStandardIO=False)
    upstream = Upstream(reactor, args.timeout)
    provider = Provider(reactor, upstream, args.authsrv, args.client_id, client_secret)
    internal = InternalAPI(upstream, origin(args.authsrv), internal_secret)
    rp = App(reactor, provider, internal, args.public_url, args.refresh_margin)
    try:
        await provider.metadata()
        log.info("discovered {issuer}", issuer=provider.issuer)
    except Unavailable as e:
        log.warn("discovery failed ({why}); retried on the first request", why=str(e))
    site = Site(SecurityHeaders(rp.resource(), origin(args.authsrv)), logFormatter=access_line)
    site.displayTracebacks = False
    try:
        await serverFromString(reactor, args.listen).listen(site)
    except (ValueError, net_error.CannotListenError) as e:
        raise SystemExit(f"rp_app: cannot listen on {args.listen}: {e}") from None
    log.info("example app listening on {listen}; open {url}/", listen=args.listen, url=args.public_url)
    await Deferred()  # never fires: react exits when the reactor stops (Ctrl-C, SIGTERM)


if __name__ == "__main__":
    react(lambda reactor: ensureDeferred(run(reactor, sys.argv[1:])))
