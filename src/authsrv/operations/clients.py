"""
Relying parties kept in the store: list, show, create, change, delete and
rotate a secret with an overlap. Clients declared in the config file are
the file's: they are shown, never changed here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred

from authsrv import events
from authsrv.client_secrets import SecretKeeper, new_client_secret
from authsrv.flows.backchannel import ATTEMPT_TIMEOUT, RefusedTarget, pinned_address
from authsrv.operations.clientspec import EDITABLE, checked_settings
from authsrv.operations.errors import Conflict, InvalidInput, NotFound, PreconditionFailed
from authsrv.operations.paging import Page, page
from authsrv.protocol.clientauth import CLIENT_SECRET_JWT, PRIVATE_KEY_JWT, auth_settings_problem
from authsrv.protocol.clients import stored_client_id_problem
from authsrv.protocol.dpop import unoffered_dpop
from authsrv.protocol.profiles import profile_problems
from authsrv.protocol.pushed import unoffered_push
from authsrv.protocol.signing import SETTINGS, SigningOffer
from authsrv.records import Client
from authsrv.remote_documents import FetchPolicy, url_problem
from authsrv.sealing import Unsealable
from authsrv.store.errors import AlreadyExists
from authsrv.tokens import CLIENT_SECRET_KEY, client_secret_hash

DEFAULT_OVERLAP = 24 * 3600
"""How long a rotated-out secret keeps working unless the operator says otherwise."""
MAX_OVERLAP = 30 * 24 * 3600
CHANGE_ATTEMPTS = 3
"""How often a change is made again on a client that another writer changed meanwhile."""


def client_etag(client: Client) -> str:
    """
    An entity tag that changes with every stored change, secret rotations
    included: a strong ETag over the whole record, the sealed secret as hex
    (JSON has no bytes; a new seal always differs, so a reseal changes the tag).
    """
    data = {key: list(v) if isinstance(v, tuple) else v.hex() if isinstance(v, bytes) else v
            for key, v in attrs.asdict(client, recurse=False).items()}
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    return f'"{digest[:32]}"'


def _check_match(client: Client, if_match: str | None) -> None:
    """RFC 9110 If-Match: C{*} or one of the listed tags; without one, last write wins."""
    if if_match is None:
        return
    tags = {tag.strip() for tag in if_match.split(",")}
    if "*" not in tags and client_etag(client) not in tags:
        raise PreconditionFailed("the client changed since it was read: GET it again and retry")


def _consistent(client: Client, pushed_offered: bool, dpop_offered: bool, fetching: FetchPolicy) -> None:
    if client.post_logout_redirect_uris and not client.end_session_enabled:
        raise InvalidInput("post_logout_redirect_uris needs end_session_enabled set to true", "end_session_enabled")
    if client.jwks_uri is not None and (uri_problem := url_problem(client.jwks_uri, fetching)):
        raise InvalidInput(f"jwks_uri: {uri_problem}", "jwks_uri")
    if problem := auth_settings_problem(client):
        raise InvalidInput(f"{problem[0]}: {problem[1]}", problem[0])
    for setting, problem_text in filter(None, (unoffered_push(client, pushed_offered),
                                               unoffered_dpop(client, dpop_offered), *profile_problems(client))):
        raise InvalidInput(f"{setting} {problem_text}", setting)


class ClientOperations:
    """
    Built with the store, the clock, the ids of the config-declared clients,
    C{resolve(host)} (a Deferred of an address, as
    L{authsrv.flows.backchannel.resolve_host}) to check back-channel hosts,
    whether the server offers pushed authorization requests and DPoP, C{signing}:
    which signing algorithms clients may choose, and C{fetching}, which
    decides which C{jwks_uri} may be registered.
    """

    def __init__(self, *, store, clock, declared: frozenset[str], resolve, pushed_offered: bool = False,
                 dpop_offered: bool = False, signing: SigningOffer = SigningOffer(),
                 fetching: FetchPolicy = FetchPolicy(), secrets: SecretKeeper | None = None):
        self._secrets = secrets
        self._pushed_offered = pushed_offered
        self._dpop_offered = dpop_offered
        self._fetching = fetching
        self._store = store
        self._clock = clock
        self._declared = declared
        self._resolve = resolve
        self._signing = signing

    def _check_signing(self, settings: dict[str, Any]) -> None:
        """Refuse a signing algorithm being set that the server does not offer."""
        for setting in SETTINGS:
            if setting in settings and (problem := self._signing.problem(setting, settings[setting])):
                raise InvalidInput(f"{setting}: {problem}", setting)

    def _now(self) -> int:
        return int(self._clock.seconds())

    def _current(self, client: Client, until: int | None) -> str | None:
        """A client_secret_jwt client's secret before a rotation, to keep in its overlap; None if it cannot be read."""
        if until is None or self._secrets is None:
            return None
        try:
            return next(iter(self._secrets.secrets(client, self._now())), None)
        except Unsealable:
            return None

    def _sealed(self, client: Client, secret: str | None, previous: str | None = None) -> bytes | None:
        """A client_secret_jwt client's secrets, sealed; None for any other client or without the key."""
        if client.token_endpoint_auth_method != CLIENT_SECRET_JWT or secret is None or self._secrets is None:
            return None
        return self._secrets.seal(client.client_id, secret, previous)

    async def list(self, limit: int | None = None, cursor: str | None = None) -> Page:
        """Clients ordered by id, at most C{limit} (up to 100) after C{cursor}."""
        return await page(self._store.list_clients, lambda c: c.client_id, limit, cursor)

    async def get(self, client_id: str) -> Client:
        client = await self._store.get_client(client_id)
        if client is None:
            raise NotFound(f"no client {client_id!r}", "client_id")
        return client

    async def _operator_client(self, client_id: str, action: str) -> Client:
        if client_id in self._declared:
            raise Conflict(f"client {client_id!r} is declared in the config file: {action} it there", "client_id")
        client = await self.get(client_id)
        if client.source == "config":
            raise Conflict(f"client {client_id!r} is declared in the config file: {action} it there", "client_id")
        return client

    async def _check_backchannel(self, uri: str | None) -> None:
        """
        Refuse a back-channel URI whose host now resolves to an address the
        server must not reach; a name that does not resolve yet passes
        (every delivery checks it again).
        """
        if uri is None:
            return
        resolving = Deferred.fromCoroutine(pinned_address(self._resolve, uri))
        try:
            await resolving.addTimeout(ATTEMPT_TIMEOUT, self._clock)
        except RefusedTarget as e:
            raise InvalidInput(f"backchannel_logout_uri: {uri!r} is refused: {e}", "backchannel_logout_uri") from None
        except Exception:
            return

    async def create(self, data: Any, *, actor: str) -> tuple[Client, str | None]:
        """
        A new client from C{data} (C{client_id}, C{redirect_uris} and the
        optional settings; C{public} for one without a secret); returns it
        and its generated secret (L{new_client_secret}), shown this once
        (None if public).
        """
        if not isinstance(data, dict):
            raise InvalidInput("the body must be a JSON object")
        client_id = data.get("client_id")
        if not isinstance(client_id, str) or (problem := stored_client_id_problem(client_id)):
            raise InvalidInput(f"client_id {problem if isinstance(client_id, str) else 'must be a string'}",
                               "client_id")
        public = data.get("public", False)
        if not isinstance(public, bool):
            raise InvalidInput("public must be true or false", "public")
        settings = checked_settings(
            {k: v for k, v in data.items() if k not in ("client_id", "public")}, EDITABLE
        )
        settings.setdefault("name", client_id)
        self._check_signing(settings)
        if client_id in self._declared:
            raise Conflict(f"client {client_id!r} is declared in the config file; edit it there", "client_id")
        await self._check_backchannel(settings.get("backchannel_logout_uri"))
        method = settings.get("token_endpoint_auth_method")
        secret = None if public or method in (PRIVATE_KEY_JWT, "none") else new_client_secret(method)
        key = await self._store.server_key(CLIENT_SECRET_KEY) if secret else b""
        client = Client(
            client_id=client_id, secret_hash=client_secret_hash(secret, key) if secret else None,
            created_at=self._now(), **{"redirect_uris": [], **settings},
        )
        client = attrs.evolve(client, sealed_secret=self._sealed(client, secret))
        _consistent(client, self._pushed_offered, self._dpop_offered, self._fetching)
        try:
            await self._store.add_client(client)
        except AlreadyExists:
            raise Conflict(f"client {client_id!r} exists already", "client_id") from None
        events.client_created(client_id=client_id, source="operator", actor=actor)
        return client, secret

    async def _change(self, client: Client, if_match: str | None, change: Callable[[Client], Client]) -> Client:
        """
        C{change(client)} stored only while the store still holds C{client}
        as read (L{authsrv.interfaces.IClientRegistry.change_client}). When
        another writer came between, C{change} is made again on what it
        wrote, or, with C{if_match}, refused; a client removed meanwhile is
        not found, and stays removed.
        """
        for attempt in range(CHANGE_ATTEMPTS):
            if attempt:
                client = await self._operator_client(client.client_id, "change")
                _check_match(client, if_match)
            changed = change(client)
            if await self._store.change_client(client, changed):
                return changed
        raise Conflict(f"client {client.client_id!r} kept changing while this change was made: try again",
                       "client_id")

    async def update(self, client_id: str, data: Any, *, actor: str, if_match: str | None = None) -> Client:
        """Change the settings named in C{data}; the others keep their values."""
        settings = checked_settings(data)
        self._check_signing(settings)
        client = await self._operator_client(client_id, "change")
        _check_match(client, if_match)
        if not settings:  # an empty merge patch (RFC 7396): nothing to write, nothing to audit
            return client
        if "backchannel_logout_uri" in settings:
            await self._check_backchannel(settings["backchannel_logout_uri"])

        def change(client: Client) -> Client:
            changed = attrs.evolve(client, **settings)
            if changed.token_endpoint_auth_method != CLIENT_SECRET_JWT:
                changed = attrs.evolve(changed, sealed_secret=None)
            _consistent(changed, self._pushed_offered, self._dpop_offered, self._fetching)
            return changed

        changed = await self._change(client, if_match, change)
        events.client_changed(client_id=client_id, source="operator", actor=actor, fields=sorted(settings))
        return changed

    async def delete(self, client_id: str, *, actor: str, if_match: str | None = None) -> None:
        """
        Remove the client; with C{if_match}, only while the store still holds
        it as read and matched, so a change landing in between is a
        L{PreconditionFailed}, not removed with it.
        """
        client = await self._operator_client(client_id, "remove")
        _check_match(client, if_match)
        if not await self._store.remove_client(client_id, None if if_match is None else client):
            if if_match is not None and await self._store.get_client(client_id) is not None:
                raise PreconditionFailed("the client changed since it was read: GET it again and retry")
            raise NotFound(f"no client {client_id!r}", "client_id")
        events.client_deleted(client_id=client_id, source="operator", actor=actor)

    async def rotate_secret(
        self, client_id: str, *, actor: str, overlap: int = DEFAULT_OVERLAP, if_match: str | None = None,
    ) -> tuple[Client, str]:
        """
        A new generated secret, returned this once; the current one keeps
        working for C{overlap} seconds (0: not at all), so apps roll
        without downtime. A previous secret still in its overlap is dropped.
        """
        if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap <= MAX_OVERLAP:
            raise InvalidInput(f"overlap must be from 0 to {MAX_OVERLAP} seconds", "overlap")
        client = await self._operator_client(client_id, "change")
        _check_match(client, if_match)
        secret = new_client_secret(client.token_endpoint_auth_method)
        key = await self._store.server_key(CLIENT_SECRET_KEY)
        until = self._now() + overlap if overlap else None

        def rotate(client: Client) -> Client:
            if client.is_public:
                raise Conflict(f"client {client_id!r} is public: it has no secret", "client_id")
            if client.token_endpoint_auth_method == PRIVATE_KEY_JWT:
                raise Conflict(f"client {client_id!r} authenticates with its keys (private_key_jwt): it has no"
                               " secret; change its jwks or jwks_uri instead", "client_id")
            rotated = attrs.evolve(
                client, secret_hash=client_secret_hash(secret, key),
                previous_secret_hash=client.secret_hash if until else None, previous_secret_until=until,
            )
            if client.token_endpoint_auth_method == CLIENT_SECRET_JWT:
                rotated = attrs.evolve(rotated,
                                       sealed_secret=self._sealed(rotated, secret, self._current(client, until)))
                _consistent(rotated, self._pushed_offered, self._dpop_offered, self._fetching)
            return rotated

        rotated = await self._change(client, if_match, rotate)
        events.client_secret_rotated(client_id=client_id, previous_until=until, actor=actor)
        return rotated, secret
