"""
The admin API: what the operator command does, over HTTP for automation
(JSON in and out), through the same L{authsrv.operations}. It has its own
bearer secret, compared in constant time as digests before anything else
(the internal API's secret is not it), and is served only where C{[admin]}
says: never on the public listener unless C{serve_on_main}. Every answer
is no-store; every refusal is C{{"error", "message", "field"?}} with a
stable code. Client updates and deletions honour C{If-Match} against the
client's ETag (412 when it changed); without it the last write wins.
"""

from __future__ import annotations

from functools import wraps
from urllib.parse import quote

from werkzeug.exceptions import MethodNotAllowed, NotFound

from authsrv.configsection import parse_duration
from authsrv.identity.errors import BackendUnavailable
from authsrv.operations import AdminOperations
from authsrv.operations.clients import DEFAULT_OVERLAP, client_etag
from authsrv.operations.errors import InvalidInput, OperationError
from authsrv.operations.views import (
    ban_view,
    client_view,
    consent_view,
    grant_view,
    key_view,
    rotation_view,
    session_view,
    user_view,
)
from authsrv.protocol import jsontext
from authsrv.store.errors import StoreUnavailable
from authsrv.web.bearer import BearerSecret
from authsrv.web.failures import MESSAGE, SERVER_ERROR, unforeseen_in_klein
from authsrv.web.headers import json_body
from authsrv.web.routes import RoutedKlein

PREFIX = "/api/admin"
MAX_BODY = 64 * 1024
LIMIT_DIGITS = 9
"""The most digits a C{limit} may have; a longer one is out of range whatever it says."""
STATUS = {"invalid_request": 400, "not_found": 404, "conflict": 409, "precondition_failed": 412}


class Problem(Exception):
    """A refusal answered with C{status} and the one error shape."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


def _answer(request, status: int, payload: dict | None) -> bytes:
    if payload is None:
        request.setResponseCode(status)
        request.setHeader(b"cache-control", b"no-store")
        return b""
    return json_body(request, status, payload, no_store=True)


def _problem(request, problem: Problem) -> bytes:
    if problem.status == 401:
        request.setHeader(b"www-authenticate", b'Bearer realm="authsrv-admin"')
    body = {"error": problem.code, "message": problem.message}
    if problem.field is not None:
        body["field"] = problem.field
    return _answer(request, problem.status, body)


def _body(request, *, required: bool) -> dict:
    """
    The JSON object of the request; an empty body is C{{}} where the
    operation needs none.
    """
    raw = request.content.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise Problem(413, "too_large", f"the body is over {MAX_BODY} bytes")
    if not raw and not required:
        return {}
    content_type = (request.getHeader(b"content-type") or b"").split(b";")[0].strip().lower()
    if content_type != b"application/json":
        raise Problem(415, "unsupported_media_type", "send the body as application/json")
    try:
        body = jsontext.loads(raw, unique_names=True)
    except jsontext.NotJSONText as e:
        raise Problem(400, "invalid_request", f"the body cannot be read: {e}") from None
    if not isinstance(body, dict):
        raise Problem(400, "invalid_request", "the body must be a JSON object")
    return body


def _known(body: dict, fields: tuple[str, ...], what: str) -> dict:
    """C{body}, whose every field is one of C{fields}; else the first other one is refused by name."""
    unknown = set(body) - set(fields)
    if unknown:
        raise InvalidInput(f"{min(unknown)} is not a field of {what}", min(unknown))
    return body


def _query(request, name: str) -> str | None:
    """The query parameter C{name}, given at most once (which of two a proxy and the server read may differ)."""
    values = request.args.get(name.encode())
    if values and len(values) > 1:
        raise InvalidInput(f"{name} is given {len(values)} times: give it once", name)
    return values[0].decode("utf-8", "replace") if values else None


def _limit(request) -> int | None:
    text = _query(request, "limit")
    if text is None:
        return None
    # "²" is a digit to isdigit, and no number to int; int() refuses over 4300 digits with a ValueError.
    if not (text.isascii() and text.isdigit()) or len(text) > LIMIT_DIGITS:
        raise InvalidInput("limit must be a whole number from 1 to 100", "limit")
    return int(text)


def _server_error(request) -> bytes:
    """The answer to a failure nothing foresaw (L{authsrv.web.failures})."""
    return _problem(request, Problem(500, SERVER_ERROR, MESSAGE))


def _if_match(request) -> str | None:
    value = request.getHeader(b"if-match")
    return None if value is None else value.decode("latin-1")


def _with_etag(request, client) -> dict:
    request.setHeader(b"etag", client_etag(client).encode())
    return client_view(client)


def _endpoint(handler):
    """The secret first, then the operation; every failure is the one JSON shape, never a 500."""

    @wraps(handler)
    async def endpoint(self, request, **params):
        try:
            self._authorize(request)
            status, payload = await handler(self, request, **params)
            return _answer(request, status, payload)
        except Problem as problem:
            return _problem(request, problem)
        except OperationError as e:
            return _problem(request, Problem(STATUS[e.code], e.code, e.message, e.field))
        except BackendUnavailable:
            return _problem(request, Problem(503, "temporarily_unavailable", "the identity backend is unavailable"))
        except StoreUnavailable:
            return _problem(request, Problem(503, "temporarily_unavailable", "the store is unavailable"))

    return endpoint


class AdminAPI:
    """The admin routes over L{AdminOperations}; C{actor} names the credential in audit events."""

    app = RoutedKlein()

    def __init__(self, *, operations: AdminOperations, secret: str, actor: str):
        self._ops = operations
        self._secret = BearerSecret(secret)
        self._actor = actor

    def resource(self):
        return self.app.resource()

    def _authorize(self, request) -> None:
        if not self._secret.presented_by(request):
            raise Problem(401, "unauthorized", "a valid Authorization: Bearer <admin API secret> is required")

    # --- clients ---------------------------------------------------------------

    @app.route(PREFIX + "/clients", methods=["GET"])
    @_endpoint
    async def list_clients(self, request):
        page = await self._ops.clients.list(_limit(request), _query(request, "cursor"))
        return 200, {"clients": [client_view(c) for c in page.items], "next_cursor": page.next_cursor}

    @app.route(PREFIX + "/clients", methods=["POST"])
    @_endpoint
    async def create_client(self, request):
        client, secret = await self._ops.clients.create(_body(request, required=True), actor=self._actor)
        request.setHeader(b"location", f"{PREFIX}/clients/{quote(client.client_id, safe='')}".encode())
        return 201, {"client": _with_etag(request, client), "client_secret": secret}

    @app.route(PREFIX + "/clients/<client_id>", methods=["GET"])
    @_endpoint
    async def get_client(self, request, client_id):
        return 200, _with_etag(request, await self._ops.clients.get(client_id))

    @app.route(PREFIX + "/clients/<client_id>", methods=["PATCH"])
    @_endpoint
    async def update_client(self, request, client_id):
        client = await self._ops.clients.update(
            client_id, _body(request, required=True), actor=self._actor, if_match=_if_match(request)
        )
        return 200, _with_etag(request, client)

    @app.route(PREFIX + "/clients/<client_id>", methods=["DELETE"])
    @_endpoint
    async def delete_client(self, request, client_id):
        await self._ops.clients.delete(client_id, actor=self._actor, if_match=_if_match(request))
        return 204, None

    @app.route(PREFIX + "/clients/<client_id>/secret", methods=["POST"])
    @_endpoint
    async def rotate_client_secret(self, request, client_id):
        body = _known(_body(request, required=False), ("overlap",), "a secret rotation")
        overlap = body.get("overlap", DEFAULT_OVERLAP)
        if isinstance(overlap, str):
            try:
                overlap = parse_duration(overlap)
            except ValueError:
                raise InvalidInput("overlap must be seconds or a duration such as 24h", "overlap") from None
        client, secret = await self._ops.clients.rotate_secret(
            client_id, actor=self._actor, overlap=overlap, if_match=_if_match(request)
        )
        return 200, {"client": _with_etag(request, client), "client_secret": secret,
                     "previous_secret_until": client.previous_secret_until}

    # --- users -------------------------------------------------------------------

    @app.route(PREFIX + "/users", methods=["POST"])
    @_endpoint
    async def create_user(self, request):
        user = await self._ops.users.create(_body(request, required=True), actor=self._actor)
        request.setHeader(b"location", f"{PREFIX}/users/{quote(user.sub, safe='')}".encode())
        return 201, {"user": user_view(user), "ban": None}

    @app.route(PREFIX + "/users/<user_id>", methods=["GET"])
    @_endpoint
    async def get_user(self, request, user_id):
        details = await self._ops.users.details(user_id)
        return 200, {"user": user_view(details.user), "ban": ban_view(details.ban)}

    @app.route(PREFIX + "/users/<user_id>", methods=["DELETE"])
    @_endpoint
    async def delete_user(self, request, user_id):
        await self._ops.users.delete(user_id, actor=self._actor)
        return 204, None

    @app.route(PREFIX + "/users/<user_id>/password", methods=["PUT"])
    @_endpoint
    async def set_password(self, request, user_id):
        body = _known(_body(request, required=True), ("password",), "a new password")
        await self._ops.users.set_password(user_id, body.get("password"), actor=self._actor)
        return 204, None

    @app.route(PREFIX + "/users/<user_id>/disable", methods=["POST"])
    @_endpoint
    async def disable_user(self, request, user_id):
        body = _known(_body(request, required=True), ("reason",), "a disable")
        user, ended = await self._ops.users.set_disabled(user_id, True, reason=body.get("reason"), actor=self._actor)
        return 200, {"sub": user.sub, "disabled": True, "sessions_ended": ended}

    @app.route(PREFIX + "/users/<user_id>/enable", methods=["POST"])
    @_endpoint
    async def enable_user(self, request, user_id):
        _known(_body(request, required=False), (), "an enable")
        user, _ = await self._ops.users.set_disabled(user_id, False, actor=self._actor)
        return 200, {"sub": user.sub, "disabled": False}

    @app.route(PREFIX + "/users/<user_id>/ban", methods=["PUT"])
    @_endpoint
    async def ban_user(self, request, user_id):
        body = _known(_body(request, required=True), ("reason", "until"), "a ban")
        banned = await self._ops.users.ban(user_id, reason=body.get("reason"), until=body.get("until"),
                                           actor=self._actor)
        return 200, {"sub": banned.sub, "until": banned.until, "sessions_ended": banned.sessions_ended}

    @app.route(PREFIX + "/users/<user_id>/ban", methods=["DELETE"])
    @_endpoint
    async def unban_user(self, request, user_id):
        await self._ops.users.unban(user_id, actor=self._actor)
        return 204, None

    @app.route(PREFIX + "/users/<user_id>/grants", methods=["GET"])
    @_endpoint
    async def user_grants(self, request, user_id):
        sub, page = await self._ops.users.grants(user_id, _limit(request), _query(request, "cursor"))
        return 200, {"sub": sub, "grants": [grant_view(g) for g in page.items], "next_cursor": page.next_cursor}

    @app.route(PREFIX + "/users/<user_id>/grants", methods=["DELETE"])
    @_endpoint
    async def revoke_user_grants(self, request, user_id):
        revoked = await self._ops.users.revoke_grants(user_id, actor=self._actor)
        return 200, {"sub": revoked.sub, "revoked": revoked.grants, "sessions_ended": revoked.sessions_ended}

    @app.route(PREFIX + "/users/<user_id>/sessions", methods=["GET"])
    @_endpoint
    async def user_sessions(self, request, user_id):
        sub, page = await self._ops.users.sessions(user_id, _limit(request), _query(request, "cursor"))
        return 200, {"sub": sub, "sessions": [session_view(s) for s in page.items], "next_cursor": page.next_cursor}

    @app.route(PREFIX + "/users/<user_id>/sessions", methods=["DELETE"])
    @_endpoint
    async def end_user_sessions(self, request, user_id):
        sub, ended = await self._ops.users.end_sessions(user_id, actor=self._actor)
        return 200, {"sub": sub, "ended": ended}

    @app.route(PREFIX + "/users/<user_id>/consents", methods=["GET"])
    @_endpoint
    async def user_consents(self, request, user_id):
        sub, consents = await self._ops.users.consents(user_id)
        return 200, {"sub": sub, "consents": [consent_view(c) for c in consents]}

    @app.route(PREFIX + "/users/<user_id>/consents", methods=["DELETE"])
    @_endpoint
    async def revoke_user_consents(self, request, user_id):
        sub, revoked = await self._ops.users.revoke_consents(user_id, actor=self._actor)
        return 200, {"sub": sub, "revoked": revoked}

    @app.route(PREFIX + "/users/<user_id>/factors", methods=["DELETE"])
    @_endpoint
    async def reset_user_factors(self, request, user_id):
        sub, removed = await self._ops.users.reset_factors(user_id, actor=self._actor)
        return 200, {"sub": sub, "removed": removed}

    # --- keys and bans --------------------------------------------------------------

    @app.route(PREFIX + "/keys", methods=["GET"])
    @_endpoint
    async def list_keys(self, request):
        return 200, {"keys": [key_view(k) for k in self._ops.keys.keys()]}

    @app.route(PREFIX + "/keys/rotate", methods=["POST"])
    @_endpoint
    async def rotate_keys(self, request):
        body = _known(_body(request, required=False), ("force",), "a key rotation")
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise InvalidInput("force must be true or false", "force")
        return 200, rotation_view(await self._ops.keys.rotate(actor=self._actor, force=force))

    @app.route(PREFIX + "/bans", methods=["GET"])
    @_endpoint
    async def list_bans(self, request):
        page = await self._ops.users.bans(_limit(request), _query(request, "cursor"))
        return 200, {"bans": [ban_view(b) for b in page.items], "next_cursor": page.next_cursor}

    # --- everything else ------------------------------------------------------------

    @app.handle_errors(NotFound)
    def not_found(self, request, failure):
        try:
            self._authorize(request)
        except Problem as problem:
            return _problem(request, problem)
        return _problem(request, Problem(404, "not_found", "no such admin endpoint"))

    @app.handle_errors(MethodNotAllowed)
    def wrong_method(self, request, failure):
        try:
            self._authorize(request)
        except Problem as problem:
            return _problem(request, problem)
        allowed = ", ".join(failure.value.valid_methods or ())
        request.setHeader(b"allow", allowed.encode())
        return _problem(request, Problem(405, "method_not_allowed", f"use {allowed}"))

    @app.handle_errors(Exception)
    def failed(self, request, failure):
        return unforeseen_in_klein(request, failure, _server_error)
