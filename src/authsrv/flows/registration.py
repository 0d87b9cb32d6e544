"""
Clients that register themselves: an AI agent or a tool connects to a
company's services without an operator provisioning it, as the Model
Context Protocol's authorization rules expect.

 - Dynamic client registration (RFC 7591) and reading, replacing or
   deleting the registration (RFC 7592), off unless configured. A registration needs the
   configured initial access token, or redirect URIs on the allowed hosts,
   or both when both are configured; it is a public client unless the
   operator allows secrets (client_secret_jwt too when the server can seal
   them, L{authsrv.client_secrets}); it is counted against a rate per address,
   refused once C{max_clients} registered clients are stored, and audited.
   The server answers with a registration access token, kept only as its
   hash, that reads or deletes that registration and no other.
 - Metadata is checked by the same rules as the operator's clients
   (L{authsrv.operations.clientspec}), then by the registration policy: no
   redirect URI on a private or link-local address (loopback stays allowed
   for native apps, RFC 8252) and only allowed hosts when a list is set,
   and no client_name that reads as the name of one of the operator's
   clients (L{OperatorNames}), which the consent page would show as theirs.

Registered clients are never first-party: every user is asked for consent.
"""

from __future__ import annotations

import hmac
import unicodedata
from typing import Any
from urllib.parse import urlsplit

import attrs
from attrs import field, frozen

from authsrv import events
from authsrv.client_secrets import SecretKeeper, new_client_secret
from authsrv.flows.ratelimit import EndpointLimit
from authsrv.operations.clientspec import checked_settings
from authsrv.operations.errors import InvalidInput
from authsrv.protocol.bearer import BEARER, access_credential
from authsrv.protocol.clientauth import CLIENT_SECRET_JWT, SECRET_METHODS
from authsrv.protocol.clients import is_loopback_host
from authsrv.protocol.dpop import UNOFFERED as UNOFFERED_DPOP
from authsrv.protocol.errors import AccessDenied, InvalidClientMetadata, InvalidRedirectURI, InvalidToken, OAuthError
from authsrv.protocol.rates import Rate, parse_rate
from authsrv.protocol.targets import private_address_problem
from authsrv.records import Client
from authsrv.tokens import CLIENT_SECRET_KEY, client_secret_hash, new_token, secret_matches, token_hash

REGISTRATION_SOURCE = "registration"
"""C{Client.source} of a client that registered itself."""
DEFAULT_RATE = "10/m"
DEFAULT_MAX_CLIENTS = 10_000
"""
Registered clients stored at most: the rate per address does not bound
them, since many addresses, or one holder of the initial access token,
may register without end.
"""
FULL = ("this server holds as many registered clients as its operator allows ([registration] max_clients):"
        " delete a registration no longer used (RFC 7592) or ask the operator to raise the limit")
GRANT_TYPES = ("authorization_code", "refresh_token")
"""What a registered client may ask for: the browser sign-in and its refresh."""
REGISTRABLE_METHODS = ("none", *SECRET_METHODS, CLIENT_SECRET_JWT)
"""
The token_endpoint_auth_method values a client may register itself with;
private_key_jwt is not one, since registration takes no keys.
"""
UNKNOWN_METHOD = f"token_endpoint_auth_method must be one of {', '.join(REGISTRABLE_METHODS)}"
OPERATOR_SOURCES = ("config", "operator")
"""C{Client.source} of the clients an operator vouches for: its config file's and the admin API's."""
TAKEN_NAME = "client_name is the name of a client of this service; choose another"
LOOKALIKES = str.maketrans("аеорсхуіјѕԁһοαν", "aeopcxyijsdhoav")
"""Cyrillic and Greek letters drawn as Latin ones, which NFKC leaves apart: "Dеmo App" with a Cyrillic е."""


@frozen
class RegistrationPolicy:
    """
    C{[registration]}: C{enabled} turns on RFC 7591 registration;
    C{initial_access_token} (None: not required) and C{allowed_redirect_hosts}
    (host names, or C{*.example.com} for any name under it; empty: any host)
    decide who may register; C{resources} are what such clients may ask
    tokens for; C{metadata_documents} turns on client ID
    metadata documents, whose redirect URIs the host list limits too;
    C{max_clients} caps the registered clients stored.
    """

    enabled: bool = False
    initial_access_token: str | None = field(default=None, repr=False)
    allowed_redirect_hosts: tuple[str, ...] = ()
    allow_confidential: bool = False
    rate: Rate | None = parse_rate(DEFAULT_RATE)
    max_clients: int = DEFAULT_MAX_CLIENTS
    metadata_documents: bool = False
    resources: tuple[str, ...] = ()
    """The resources (RFC 8707) every such client may ask tokens for: the servers behind authsrv."""

    def host_allowed(self, host: str) -> bool:
        """Whether a redirect URI on C{host} passes the host list."""
        if not self.allowed_redirect_hosts:
            return True
        host = host.lower()
        return any(host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:]))
                   for pattern in self.allowed_redirect_hosts)


def host_pattern_problem(pattern: str) -> str | None:
    """What is wrong with C{pattern} as an allowed redirect host, or None."""
    name = pattern[2:] if pattern.startswith("*.") else pattern
    if not name or name != name.lower() or any(c in name for c in "*/:@ ") or name.startswith("."):
        return f"{pattern!r} must be a lower-case host name, or *. and a domain such as *.example.com"
    return None


def _redirect_uri_refusal(uri: str, policy: RegistrationPolicy) -> str | None:
    """Why the registration policy refuses C{uri}, which the operator's rules already allow; or None."""
    host = urlsplit(uri).hostname
    if host is None:
        return None if not policy.allowed_redirect_hosts else (
            f"{uri!r} has no host: only redirect URIs on the allowed hosts may be registered")
    if not is_loopback_host(host) and (problem := private_address_problem(host)):
        return f"{uri!r} is refused: {problem}"
    if not policy.host_allowed(host):
        return f"{uri!r} is not on a host this server allows clients to register"
    return None


def registered_settings(metadata: Any, policy: RegistrationPolicy, dpop_offered: bool = False,
                        sealing: bool = False) -> tuple[dict[str, Any], str]:
    """
    The client settings of RFC 7591 C{metadata} and its token endpoint
    authentication method, or L{InvalidRedirectURI} / L{InvalidClientMetadata}
    naming the field. Fields this server does not use are ignored, as RFC
    7591 section 2 asks; C{dpop_bound_access_tokens} (RFC 9449 section 5.2)
    is honoured when the server offers DPoP (C{dpop_offered}) and refused
    when it does not. client_secret_jwt needs C{sealing}: the server must
    keep the secret itself to check an HMAC.
    """
    if not isinstance(metadata, dict):
        raise InvalidClientMetadata("the client metadata must be a JSON object")
    method = metadata.get("token_endpoint_auth_method", "none")
    if method not in REGISTRABLE_METHODS:
        raise InvalidClientMetadata(UNKNOWN_METHOD)
    if method != "none" and not policy.allow_confidential:
        raise InvalidClientMetadata(f"token_endpoint_auth_method {method} is refused: this server registers public"
                                    " clients only (PKCE) unless the operator sets [registration] allow_confidential")
    if method == CLIENT_SECRET_JWT and not sealing:
        raise InvalidClientMetadata("token_endpoint_auth_method client_secret_jwt is not offered: the operator must"
                                    " set [client_secrets] encryption_key_file or encryption_key_env")
    response_types = metadata.get("response_types", ["code"])
    if response_types != ["code"]:
        raise InvalidClientMetadata('response_types must be ["code"]: the only response type this server offers')
    grant_types = metadata.get("grant_types", ["authorization_code"])
    if isinstance(grant_types, list) and any(name not in GRANT_TYPES for name in grant_types):
        raise InvalidClientMetadata(f"grant_types may name only {', '.join(GRANT_TYPES)}")
    if isinstance(grant_types, list) and grant_types and "authorization_code" not in grant_types:
        raise InvalidClientMetadata("grant_types must include authorization_code: the response type code"
                                    " needs it (RFC 7591 section 2.1), and no code could be exchanged without it")
    if "redirect_uris" not in metadata:
        raise InvalidRedirectURI("redirect_uris is missing: name at least one")
    data = {"redirect_uris": metadata["redirect_uris"], "grant_types": grant_types,
            "resources": list(policy.resources)}
    if "client_name" in metadata:
        data["name"] = metadata["client_name"]
    if "dpop_bound_access_tokens" in metadata:
        data["dpop_bound_access_tokens"] = metadata["dpop_bound_access_tokens"]
    try:
        settings = checked_settings(data)
    except InvalidInput as e:
        message = e.message.replace("name must", "client_name must", 1) if e.field == "name" else e.message
        raise (InvalidRedirectURI if e.field == "redirect_uris" else InvalidClientMetadata)(message) from None
    if not settings["redirect_uris"]:
        raise InvalidRedirectURI("redirect_uris must name at least one URI")
    if settings.get("dpop_bound_access_tokens") and not dpop_offered:
        raise InvalidClientMetadata(f"dpop_bound_access_tokens {UNOFFERED_DPOP}")
    for uri in settings["redirect_uris"]:
        if refusal := _redirect_uri_refusal(uri, policy):
            raise InvalidRedirectURI(refusal)
    return settings, method


def name_key(name: str) -> str:
    """
    C{name} as a reader compares it: compatibility forms (NFKC), case,
    invisible format characters, runs of spaces and common lookalike
    letters make no difference to how a consent page shows it.
    """
    text = unicodedata.normalize("NFKC", name).casefold()
    visible = "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) != "Cf")
    return " ".join(visible.translate(LOOKALIKES).split())


class OperatorNames:
    """
    Refuses a self-registered client the name of one of the operator's
    clients, read from the C{store} at each check: they are few, and one
    the admin API adds or renames counts at once.
    """

    def __init__(self, store):
        self._store = store

    async def check(self, name: str) -> None:
        """L{InvalidClientMetadata} when C{name} reads as an operator client's name."""
        key = name_key(name)
        if key and any(name_key(c.name) == key for c in await self._store.list_clients_of(OPERATOR_SOURCES)):
            raise InvalidClientMetadata(TAKEN_NAME)


def registered_method(client: Client) -> str:
    """How a registered client authenticates, as RFC 7591 names it (a stored None: by its secret)."""
    if client.token_endpoint_auth_method is not None:
        return client.token_endpoint_auth_method
    return "none" if client.is_public else SECRET_METHODS[0]


def client_metadata(client: Client, method: str) -> dict[str, Any]:
    """A client's registered metadata as RFC 7591 names it (and RFC 9449 section 5.2, when bound)."""
    metadata = {
        "client_id": client.client_id,
        "client_id_issued_at": client.created_at,
        "client_name": client.name,
        "redirect_uris": list(client.redirect_uris),
        "grant_types": list(client.grant_types),
        "response_types": ["code"],
        "token_endpoint_auth_method": method,
    }
    if client.dpop_bound_access_tokens:
        metadata["dpop_bound_access_tokens"] = True
    return metadata


class Registration:
    """
    The registration endpoint and its per-client URIs: C{store} keeps the
    clients, C{limit} counts requests per address, C{base} is the
    registration endpoint's URL, C{dpop_offered} whether clients may ask
    for DPoP-bound tokens, C{secrets} what seals client_secret_jwt secrets
    (None: that method cannot be registered).
    """

    def __init__(self, *, store, clock, policy: RegistrationPolicy, base: str, dpop_offered: bool = False,
                 secrets: SecretKeeper | None = None):
        self._dpop_offered = dpop_offered
        self._secrets = secrets
        self._store = store
        self._names = OperatorNames(store)
        self._clock = clock
        self._policy = policy
        self._base = base
        self.limit = EndpointLimit("registration", clock)

    def _refused(self, error: OAuthError, address: str) -> OAuthError:
        events.registration_refused(address=address, reason=error.description)
        return error

    def _check_initial_token(self, authorization: bytes | None, address: str) -> None:
        expected = self._policy.initial_access_token
        if expected is None:
            return
        try:
            presented = _bearer(authorization)
        except OAuthError:
            raise self._refused(InvalidToken("an initial access token is required: send Authorization: Bearer"
                                             " <token> as the operator gave it to you"), address) from None
        if not hmac.compare_digest(presented.encode(), expected.encode()):
            raise self._refused(InvalidToken("the initial access token is not valid"), address)

    async def _check_room(self, address: str) -> None:
        """
        Refuse a registration once C{max_clients} are stored: 403
        C{access_denied}, as Keycloak refuses beyond its max-clients policy,
        since waiting does not help; only a deletion or the operator does.
        Registrations racing past the count may overshoot it by as many as
        ran beside each other.
        """
        if await self._store.count_clients(REGISTRATION_SOURCE) >= self._policy.max_clients:
            raise self._refused(AccessDenied(FULL), address)

    async def register(self, metadata: Any, authorization: bytes | None, address: str) -> dict[str, Any]:
        """RFC 7591 section 3: a new client from C{metadata}; the answer holds its credentials, shown once."""
        self.limit.address(address, self._policy.rate)
        self._check_initial_token(authorization, address)
        try:
            settings, method = registered_settings(metadata, self._policy, self._dpop_offered,
                                                   self._secrets is not None)
            await self._names.check(settings.get("name", ""))
        except OAuthError as e:
            raise self._refused(e, address) from None
        await self._check_room(address)
        client_id = new_token(18)
        settings.setdefault("name", client_id)
        secret = new_client_secret(method) if method != "none" else None
        key = await self._store.server_key(CLIENT_SECRET_KEY) if secret else b""
        access_token = new_token(32)
        keeper = self._secrets if method == CLIENT_SECRET_JWT else None
        sealed = keeper.seal(client_id, secret) if keeper is not None and secret is not None else None
        client = Client(
            client_id=client_id, secret_hash=client_secret_hash(secret, key) if secret else None,
            created_at=int(self._clock.seconds()), source=REGISTRATION_SOURCE,
            registration_token_hash=token_hash(access_token),
            token_endpoint_auth_method=CLIENT_SECRET_JWT if sealed else None, sealed_secret=sealed, **settings,
        )
        await self._store.add_client(client)
        events.client_created(client_id=client_id, source=REGISTRATION_SOURCE, actor=REGISTRATION_SOURCE,
                              address=address)
        answer = client_metadata(client, method)
        if secret:
            answer.update(client_secret=secret, client_secret_expires_at=0)
        answer.update(registration_access_token=access_token, registration_client_uri=f"{self._base}/{client_id}")
        return answer

    async def _own(self, client_id: str, authorization: bytes | None, address: str) -> Client:
        """The registration C{authorization}'s token was issued for, or L{InvalidToken} (RFC 7592 section 2)."""
        self.limit.address(address, self._policy.rate)
        token = _bearer(authorization)
        client = await self._store.get_client(client_id)
        stored = client.registration_token_hash if client is not None else None
        if stored is None or not hmac.compare_digest(stored, token_hash(token)):
            raise InvalidToken("the registration access token is not valid for this client")
        return client

    async def read(self, client_id: str, authorization: bytes | None, address: str) -> dict[str, Any]:
        client = await self._own(client_id, authorization, address)
        return {**client_metadata(client, registered_method(client)),
                "registration_client_uri": f"{self._base}/{client_id}"}

    async def update(self, client_id: str, metadata: Any, authorization: bytes | None,
                     address: str) -> dict[str, Any]:
        """
        RFC 7592 section 2.2: the client's metadata replaced by C{metadata},
        checked as at registration; its id, secret and issued tokens stay. The
        registration access token is replaced: the answer must carry one
        (section 3) and only its hash is kept, and so a copy that leaked
        stops working at the owner's next update. A client_secret_jwt client
        moving to a plain secret method loses its sealed secret; no client
        moves into client_secret_jwt, since only its secret's hash is kept.
        """
        client = await self._own(client_id, authorization, address)
        if not isinstance(metadata, dict) or metadata.get("client_id") != client_id:
            raise InvalidClientMetadata("client_id must be given and be this client's id")
        await self._check_secret(client, metadata)
        method = registered_method(client)
        asked = metadata.get("token_endpoint_auth_method", method)
        if asked not in REGISTRABLE_METHODS:
            raise InvalidClientMetadata(UNKNOWN_METHOD)
        if (asked == "none") != client.is_public:
            raise InvalidClientMetadata("token_endpoint_auth_method cannot change between none and a secret:"
                                        " register a new client")
        if asked == CLIENT_SECRET_JWT and method != CLIENT_SECRET_JWT:
            raise InvalidClientMetadata("token_endpoint_auth_method cannot change to client_secret_jwt: the server"
                                        " keeps only a hash of this client's secret, and an HMAC needs the secret"
                                        " itself; register a new client")
        settings, _ = registered_settings({**metadata, "token_endpoint_auth_method": "none"}, self._policy,
                                          self._dpop_offered)
        await self._names.check(settings.get("name", ""))
        settings.setdefault("name", client_id)
        access_token = new_token(32)
        changed = attrs.evolve(client, registration_token_hash=token_hash(access_token), **settings)
        fields = sorted([*settings, "registration_access_token"])
        if method == CLIENT_SECRET_JWT and asked != method:
            changed = attrs.evolve(changed, token_endpoint_auth_method=None, sealed_secret=None)
            fields = sorted([*fields, "token_endpoint_auth_method"])
        if not await self._store.change_client(client, changed):
            if await self._store.get_client(client_id) is None:
                raise InvalidToken("the registration access token is not valid for this client")
            raise InvalidClientMetadata("the client changed while this update was made: read it and send it again")
        events.client_changed(client_id=client_id, source=REGISTRATION_SOURCE, actor=REGISTRATION_SOURCE,
                              fields=fields, address=address)
        return {**client_metadata(changed, asked), "registration_access_token": access_token,
                "registration_client_uri": f"{self._base}/{client_id}"}

    async def _check_secret(self, client: Client, metadata: dict[str, Any]) -> None:
        """
        RFC 7592 section 2.2: a client_secret in an update must be the
        client's current one, since no client chooses its secret; ignoring
        another would let a client believe its secret had changed.
        """
        if "client_secret" not in metadata:
            return
        secret = metadata["client_secret"]
        key = await self._store.server_key(CLIENT_SECRET_KEY) if client.secret_hash else b""
        if not (isinstance(secret, str) and client.secret_hash
                and secret_matches(secret, [client.secret_hash], key)[0]):
            raise InvalidClientMetadata("client_secret must be this client's current secret, or left out: a client"
                                        " cannot choose its secret (RFC 7592 section 2.2)")

    async def delete(self, client_id: str, authorization: bytes | None, address: str) -> None:
        client = await self._own(client_id, authorization, address)
        await self._store.remove_client(client.client_id)
        events.client_deleted(client_id=client_id, source=REGISTRATION_SOURCE, actor=REGISTRATION_SOURCE,
                              address=address)


def _bearer(authorization: bytes | None) -> str:
    """The token of C{Authorization: Bearer}: registration tokens are never DPoP-bound."""
    scheme, token = access_credential(authorization, None)
    if scheme != BEARER:
        raise InvalidToken("send the token as Authorization: Bearer <token>")
    return token
