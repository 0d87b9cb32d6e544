"""
The internal API for first-party services (SERVICE-INTERFACE.md): JSON in
and out, a bearer secret compared in constant time before anything else,
no cookies, no CORS. Served on the main site, on a separate listener, or
both (C{[internal] listen} and C{serve_on_main}).
"""

from __future__ import annotations

import json
from functools import wraps

from twisted.logger import Logger
from werkzeug.exceptions import MethodNotAllowed, NotFound

from authsrv.chat.errors import ChatError
from authsrv.flows.ratelimit import EndpointLimit, RateLimited
from authsrv.flows.user_access import user_access
from authsrv.identity.errors import BackendUnavailable
from authsrv.isotime import iso_utc
from authsrv.protocol import jsontext
from authsrv.protocol.forwarded import address_key
from authsrv.protocol.rates import Rate
from authsrv.store.errors import StoreUnavailable
from authsrv.web.bearer import BearerSecret
from authsrv.web.failures import MESSAGE, SERVER_ERROR, unforeseen_in_klein
from authsrv.web.forms import client_address_of
from authsrv.web.headers import RETRY_AFTER, json_body
from authsrv.web.routes import Endpoint, ExactPaths, RoutedKlein

PREFIX = "/api/internal"
USER_ACCESS_PATH = PREFIX + "/user-access"


class RequestProblem(Exception):
    """An internal request that is answered with C{status} and C{code}."""

    def __init__(self, status: int, code: str, message: str, **extra):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra


def _answer(request, status: int, payload: dict) -> bytes:
    return json_body(request, status, payload, no_store=True)


def _problem(request, problem: RequestProblem) -> bytes:
    if problem.status == 401:
        request.setHeader(b"www-authenticate", b'Bearer realm="authsrv-internal"')
    return _answer(request, problem.status, {"error": problem.code, "message": problem.message, **problem.extra})


def _wrong_method(request) -> bytes:
    request.setHeader(b"allow", b"POST")
    return _problem(request, RequestProblem(405, "method_not_allowed", "use POST"))


def _server_error(request) -> bytes:
    """The answer to a failure nothing foresaw (L{authsrv.web.failures})."""
    return _problem(request, RequestProblem(500, SERVER_ERROR, MESSAGE))


def _loads(raw: bytes):
    """
    C{raw} as JSON, refusing an object that names a member twice: of two
    userIds, a proxy or WAF in front may check the first while C{json}
    keeps the last, as with a repeated OAuth parameter or header. A body of
    at most four quotes, as every C{{"userId": "..."}} is, holds one member
    at most, so the usual request is parsed at C{json}'s plain speed.
    """
    if raw.count(b'"') <= 4:
        return json.loads(raw)
    return jsontext.loads(raw, unique_names=True)


def _user_id(request) -> str:
    """The userId (or its alias authUserId) of a JSON object body."""
    content_type = (request.getHeader(b"content-type") or b"").split(b";")[0].strip().lower()
    if content_type != b"application/json":
        raise RequestProblem(400, "invalid_request", "send the body as JSON, with Content-Type: application/json")
    try:
        body = _loads(request.content.read())
    except jsontext.NotJSONText as e:
        raise RequestProblem(400, "invalid_request", f"the body is not JSON this service reads: {e}") from None
    except (ValueError, RecursionError):
        raise RequestProblem(400, "invalid_request", "the body is not valid JSON (or nested too deeply)") from None
    if not isinstance(body, dict):
        raise RequestProblem(400, "invalid_request", "the body must be a JSON object")
    present = [(name, body[name]) for name in ("userId", "authUserId") if name in body]
    if not present:
        raise RequestProblem(400, "invalid_request", "userId is missing")
    for name, value in present:
        if not isinstance(value, str) or not value:
            raise RequestProblem(400, "invalid_request", f"{name} must be a non-empty string")
    if len({value for _, value in present}) > 1:
        raise RequestProblem(400, "invalid_request", "userId and authUserId name different users")
    return present[0][1]


def _endpoint(handler):
    """
    The caller's rate, then the secret, then the body; every failure is a
    JSON problem, never a 500. Callers with the secret and without it count
    in buckets of their own, so that no one at the address of a first-party
    service (a stale secret on the same host, anyone behind the same NAT)
    spends its rate.
    """

    @wraps(handler)
    async def endpoint(self, request):
        try:
            authorized = self._secret is not None and self._secret.presented_by(request)
            if self._rate is not None:
                address = client_address_of(request, self._trusted_proxies)
                buckets = self._limit.by_client if authorized else self._limit.by_address
                self._limit.count(buckets, address_key(address), self._rate, client_id=None, address=address)
            if not authorized:
                self._refuse()
            return await handler(self, request, _user_id(request))
        except RequestProblem as problem:
            return _problem(request, problem)
        except RateLimited as limited:
            request.setHeader(b"retry-after", str(limited.retry_after).encode())
            return _problem(request, RequestProblem(429, limited.error, limited.description))
        except BackendUnavailable:
            request.setHeader(b"retry-after", RETRY_AFTER)
            return _problem(request, RequestProblem(
                503, "temporarily_unavailable", "the identity backend is unavailable; try again"))
        except StoreUnavailable:
            request.setHeader(b"retry-after", RETRY_AFTER)
            return _problem(request, RequestProblem(
                503, "temporarily_unavailable", "the store is unavailable; try again"))

    return endpoint


class InternalAPI:
    """
    The two internal endpoints; collaborators come from the constructor.
    Every service shares the one secret, so requests count against C{rate}
    (None: no limit) by the caller's address, behind C{trusted_proxies} too.
    """

    app = RoutedKlein()
    log = Logger()

    def __init__(self, *, reactor, secret: str | None, store, identity, chat_tokens, rate: Rate | None = None,
                 trusted_proxies=()):
        self._reactor = reactor
        self._rate = rate
        self._trusted_proxies = trusted_proxies
        self._limit = EndpointLimit("internal", reactor)
        self._secret = BearerSecret(secret) if secret else None
        self._store = store
        self._identity = identity
        self._chat_tokens = chat_tokens

    def resource(self) -> ExactPaths:
        """user-access, called on every session check, as a plain leaf (L{Endpoint}); the rest through Klein."""
        return ExactPaths({
            USER_ACCESS_PATH.encode(): Endpoint(USER_ACCESS_PATH, {b"POST": self.check_user_access}, _wrong_method,
                                                 _server_error),
        }, self.app.resource())

    def _refuse(self) -> None:
        if self._secret is None:
            raise RequestProblem(401, "unauthorized", "the internal API has no secret configured")
        raise RequestProblem(401, "unauthorized", "a valid Authorization: Bearer <internal API secret> is required")

    @_endpoint
    async def check_user_access(self, request, sub: str):
        status = await user_access(self._identity, self._store, sub, int(self._reactor.seconds()))
        if status is None:
            raise RequestProblem(404, "user_not_found", "no user has that id", allowed=False)
        return _answer(request, 200, status)

    @app.route(PREFIX + "/chat-token", methods=["POST"])
    @_endpoint
    async def chat_token(self, request, sub: str):
        try:
            account = await self._chat_tokens.fresh_token(sub, int(self._reactor.seconds()))
        except ChatError as e:
            raise RequestProblem(e.status, e.code, str(e)) from None
        return _answer(request, 200, {
            "accountId": account.account_id,
            "accessToken": account.access_token,
            "scope": account.scope,
            "accessTokenExpiresAt": iso_utc(account.expires_at),
        })

    @app.handle_errors(NotFound)
    def not_found(self, request, failure):
        return _problem(request, RequestProblem(404, "not_found", "no such internal endpoint"))

    @app.handle_errors(MethodNotAllowed)
    def wrong_method(self, request, failure):
        return _wrong_method(request)

    @app.handle_errors(Exception)
    def failed(self, request, failure):
        return unforeseen_in_klein(request, failure, _server_error)
