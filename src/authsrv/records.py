"""
Plain values passed between flows, stores, identity backends and keystores.

Every record is frozen: a store hands out values, never live rows, so a flow
cannot change state except through an explicit (atomic) store operation.
Times are integer seconds since the epoch; tokens, codes and session ids are
only ever present as SHA-256 hex digests (see L{authsrv.tokens.token_hash}).
"""

from __future__ import annotations

import enum
from typing import Final

from attrs import field, frozen


def _tuple(value) -> tuple:
    return tuple(value)


def _frozenset(value) -> frozenset:
    return frozenset(value)


DEFAULT_GRANT_TYPES = ("authorization_code", "refresh_token")
NO_USER = ""
"""The stored C{sub} of a grant and tokens a client got for itself (client_credentials): no user's."""
"""The grants a client may use unless its registration says otherwise."""

ACR_PWD = "urn:authsrv:acr:pwd"
"""Authentication context class of a sign-in with one factor (a password)."""
ACR_MFA = "urn:authsrv:acr:mfa"
"""Authentication context class of a sign-in with a second factor."""
PASSWORD_AMR = ("pwd",)
"""RFC 8176 methods of a password sign-in."""


class NotRead(enum.Enum):
    """What a lookup was not asked to read: unknown, where None is read and absent."""

    NOT_READ = "not read"


NOT_READ: Final = NotRead.NOT_READ


@frozen
class Client:
    """
    A relying party provisioned by the operator.

    C{secret_hash} is the SHA-256 hex digest of the client secret, or L{None}
    for a public client, which authenticates by PKCE alone. C{source} says
    who made it: C{"config"} (the config file's, removed with it) or
    C{"operator"}. C{refresh_grace} overrides the server's grace window for
    this client's refresh tokens; C{rate_limit} its request rate (C{"50/s"},
    C{"off"}); C{audiences} are the resources it serves as a resource
    server, so it may introspect access tokens meant for them.
    C{previous_secret_hash} is the secret a rotation replaced, still
    accepted until C{previous_secret_until}, so apps roll without downtime.
    C{require_mfa} asks every user signing in to it for a second factor.
    C{require_pushed_authorization_requests} refuses its authorization
    requests unless they were pushed first (RFC 9126); C{profile} names a
    security profile its settings were checked against (C{"fapi2"}), or None.
    The C{*_signed_response_alg} settings choose the JWS algorithm of its ID
    tokens, JWT access tokens and UserInfo responses (None: plain JSON);
    see L{authsrv.protocol.signing}.
    C{registration_token_hash} is the hash of the registration access token
    of a client that registered itself (C{source} C{"registration"}, RFC
    7592), None for every other client.
    C{token_endpoint_auth_method} is how it authenticates (None: by its
    secret, Basic or form, or as a public client); with C{private_key_jwt}
    its keys are C{jwks} (a JWK set's JSON) or at C{jwks_uri}. C{scopes}
    are what it may ask for with client_credentials, for itself.
    """

    client_id: str
    secret_hash: str | None
    redirect_uris: tuple[str, ...] = field(converter=_tuple)
    post_logout_redirect_uris: tuple[str, ...] = field(default=(), converter=_tuple)
    name: str = ""
    end_session_enabled: bool = False
    first_party: bool = False
    resources: tuple[str, ...] = field(default=(), converter=_tuple)
    introspect_any: bool = False
    backchannel_logout_uri: str | None = None
    created_at: int = 0
    grant_types: tuple[str, ...] = field(default=DEFAULT_GRANT_TYPES, converter=_tuple)
    source: str = "operator"
    refresh_grace: int | None = None
    rate_limit: str | None = None
    audiences: tuple[str, ...] = field(default=(), converter=_tuple)
    previous_secret_hash: str | None = None
    previous_secret_until: int | None = None
    require_mfa: bool = False
    require_pushed_authorization_requests: bool = False
    profile: str | None = None
    id_token_signed_response_alg: str = "RS256"
    access_token_signed_response_alg: str = "RS256"
    userinfo_signed_response_alg: str | None = None
    registration_token_hash: str | None = None
    token_endpoint_auth_method: str | None = None
    jwks: str | None = None
    jwks_uri: str | None = None
    scopes: tuple[str, ...] = field(default=(), converter=_tuple)
    dpop_bound_access_tokens: bool = False
    """Every token request must come with a DPoP proof (RFC 9449 section 5.2)."""
    sealed_secret: bytes | None = field(default=None, repr=False)
    """
    A client_secret_jwt client's secret (and, in a rotation's overlap, the
    previous one), sealed by L{authsrv.client_secrets.SecretKeeper}; None
    for every other client.
    """

    @property
    def is_public(self) -> bool:
        """No secret and no keys: it proves nothing but its client_id (and PKCE)."""
        return self.secret_hash is None and self.token_endpoint_auth_method in (None, "none")

    @property
    def stored(self) -> bool:
        """Whether the store holds it: every client but one described by its metadata document, read from its URL."""
        return self.source != "document"

    @property
    def registered_itself(self) -> bool:
        """No operator vouched for it: it registered (RFC 7591) or is described by its own metadata document."""
        return self.source in ("registration", "document")


@frozen
class User:
    """
    A user as an identity backend knows them.

    A backend's own disabled flag counts as a ban (docs/design.md, Bans);
    C{disabled_reason} is reported as the ban reason.
    """

    sub: str
    login: str
    name: str | None = None
    picture: str | None = None
    email: str | None = None
    email_verified: bool = False
    disabled: bool = False
    disabled_reason: str | None = None
    chat_user_id: str | None = None


@frozen
class BrowserSession:
    """
    A user's logged-in session at the service.

    C{session_hash} is the hash of the opaque cookie value; C{sid} is the
    public session id put in ID tokens and logout tokens. C{amr} and C{acr}
    say how the user authenticated at C{auth_time} (RFC 8176 method values;
    L{ACR_PWD} or L{ACR_MFA}).
    """

    session_hash: str
    sid: str
    sub: str
    auth_time: int
    created_at: int
    expires_at: int
    amr: tuple[str, ...] = field(default=PASSWORD_AMR, converter=_tuple)
    acr: str = ACR_PWD
    user_agent: str | None = None
    """The browser's User-Agent when it signed in, to name the device on the account page."""
    address: str | None = None
    """The client address it signed in from."""
    last_seen: int | None = None
    """When a request last used the session (to the minute), None until one did."""


@frozen
class AuthorizationRequest:
    """A validated authorization request: everything a code will be bound to."""

    client_id: str
    redirect_uri: str
    scope: tuple[str, ...] = field(converter=_tuple)
    state: str
    code_challenge: str
    nonce: str | None = None
    resources: tuple[str, ...] = field(default=(), converter=_tuple)
    prompt: frozenset[str] = field(default=frozenset(), converter=_frozenset)
    max_age: int | None = None
    login_hint: str | None = None
    acr_values: tuple[str, ...] = field(default=(), converter=_tuple)
    """The authentication context classes asked for (acr_values, or the claims request's acr)."""
    device: bool = False
    """
    A sign-in for one of this service's own pages, which C{redirect_uri}
    names: the device verification page (RFC 8628 section 3.3), or the
    account page signing its user in again. It returns there, never with a
    code.
    """
    dpop_jkt: str | None = None
    """The thumbprint of the key the code is bound to (RFC 9449 section 10)."""
    hinted_sub: str | None = None
    """
    The user the request's id_token_hint names (OIDC Core section 3.1.2.1):
    a sign-in by anyone else ends in login_required, never a code.
    """


LOGIN_STAGE = "login"
MFA_STAGE = "mfa"
ENROL_STAGE = "enrol"
CONSENT_STAGE = "consent"


@frozen
class Interaction:
    """
    A sign-in in progress between the authorization request and the code,
    kept server-side so that the browser's forms carry only
    C{interaction_id} and a CSRF token. C{stage} says what the user does
    next (L{LOGIN_STAGE}, L{MFA_STAGE}, L{ENROL_STAGE}, L{CONSENT_STAGE});
    at the consent stage C{sid} names the browser session that must give
    it, so a consent is never given by a user other than the one who was
    shown the page. At the login stage C{address} is the client address that
    asked, so the store can cap how many sign-ins one address keeps waiting
    (docs/design.md, Limits). At the second-factor and enrolment stages C{sub} is
    the user whose first factor (C{amr}) was accepted, and C{sid} the
    session being stepped up, if any.
    """

    interaction_id: str
    stage: str
    request: AuthorizationRequest
    csrf_token: str
    created_at: int
    expires_at: int
    sid: str | None = None
    address: str | None = None
    sub: str | None = None
    amr: tuple[str, ...] = field(default=(), converter=_tuple)


@frozen
class PushedRequest:
    """
    An authorization request a client pushed (RFC 9126), waiting under the
    hash of the C{request_uri} it was given until the browser brings that
    to the authorization endpoint, once, before C{expires_at}. C{query} is
    the request's parameters form-encoded as pushed, so the authorization
    endpoint validates them exactly as it validates its own query.
    """

    uri_hash: str
    client_id: str
    query: str
    created_at: int
    expires_at: int


@frozen
class LinkAttempt:
    """
    A chat-account link in progress: kept under the hash of the random
    C{state} sent to the provider, for the user and browser session that
    started it, with the PKCE verifier when PKCE is used.
    """

    state_hash: str
    sub: str
    session_hash: str
    created_at: int
    expires_at: int
    code_verifier: str | None = None


@frozen
class Grant:
    """
    What a user granted a client: the family of every code, access token and
    refresh token issued from one authorization. Revoking it revokes them all.
    """

    grant_id: str
    client_id: str
    sub: str
    scope: frozenset[str] = field(converter=_frozenset)
    resource: tuple[str, ...] = field(default=(), converter=_tuple)
    auth_time: int = 0
    sid: str | None = None
    created_at: int = 0
    expires_at: int = 0
    revoked_at: int | None = None
    amr: tuple[str, ...] = field(default=PASSWORD_AMR, converter=_tuple)
    acr: str = ACR_PWD


@frozen
class AuthorizationCode:
    """
    A single-use authorization code, bound to everything the request said.
    """

    code_hash: str
    grant_id: str
    client_id: str
    sub: str
    redirect_uri: str
    scope: frozenset[str] = field(converter=_frozenset)
    code_challenge: str = ""
    code_challenge_method: str = "S256"
    nonce: str | None = None
    resource: tuple[str, ...] = field(default=(), converter=_tuple)
    auth_time: int = 0
    sid: str | None = None
    issued_at: int = 0
    expires_at: int = 0
    amr: tuple[str, ...] = field(default=PASSWORD_AMR, converter=_tuple)
    acr: str = ACR_PWD
    dpop_jkt: str | None = None


@frozen
class AccessToken:
    """
    An issued access token, opaque or JWT (RFC 9068); either way only the hash
    of the exact string handed out is stored, so one indexed lookup answers
    introspection for both kinds. C{user_ban} is never stored: a lookup
    fills in the user's ban record, if any, so that the same round trip
    answers whether the user is banned.
    """

    token_hash: str
    grant_id: str
    client_id: str
    sub: str
    scope: frozenset[str] = field(converter=_frozenset)
    audience: tuple[str, ...] = field(default=(), converter=_tuple)
    jti: str | None = None
    issued_at: int = 0
    expires_at: int = 0
    user_ban: "Ban | None" = None
    jkt: str | None = None
    """The DPoP key's thumbprint (RFC 7638) the token is bound to; None for a bearer token."""
    linked_user_id: str | None | NotRead = field(default=NOT_READ, eq=False)
    """
    The user's account id at the chat platform a lookup named
    (C{link_provider}), None when not linked there, read in the same round
    trip so that UserInfo and ID tokens need no other call for C{chat_user_id};
    never stored and not part of the token's equality.
    """

    @property
    def for_user(self) -> bool:
        """False for a token a client got for itself (client_credentials): no user, no bans, no UserInfo."""
        return self.sub != NO_USER


@frozen
class RefreshToken:
    """
    An issued refresh token. C{consumed_at} is set when it was rotated;
    C{grace_until} and C{replay} let a client that lost the rotation response
    get the same (encrypted) response again within the grace window.
    C{user_ban}, as for L{AccessToken}, is filled in by lookups only.
    """

    token_hash: str
    grant_id: str
    client_id: str
    sub: str
    scope: frozenset[str] = field(converter=_frozenset)
    issued_at: int = 0
    expires_at: int = 0
    consumed_at: int | None = None
    grace_until: int | None = None
    replay: bytes | None = None
    revoked: bool = False
    user_ban: "Ban | None" = None
    jkt: str | None = None
    """The DPoP key a public client's refresh token is bound to (RFC 9449 section 5)."""
    grant: "Grant | None" = field(default=None, eq=False, repr=False)
    """
    Its grant, filled in by lookups only, so a refresh reads token, grant
    and ban in one round trip; not part of the token's equality.
    """
    linked_user_id: str | None | NotRead = field(default=NOT_READ, eq=False)
    """As for L{AccessToken}."""


@frozen
class Consent:
    """The scopes a user consented to for a client, and when."""

    sub: str
    client_id: str
    scope: frozenset[str] = field(converter=_frozenset)
    created_at: int = 0


@frozen
class Ban:
    """
    An operator's ban of a user; C{until} of L{None} means until lifted.
    """

    sub: str
    reason: str | None
    created_at: int
    until: int | None = None

    def in_force(self, now: int) -> bool:
        return self.until is None or self.until > now


@frozen
class LinkedAccount:
    """
    A chat-platform account linked to a user. Provider tokens are held only in
    encrypted form; C{version} supports compare-and-swap token updates.
    """

    account_id: str
    sub: str
    provider: str
    provider_user_id: str
    access_token_enc: bytes
    refresh_token_enc: bytes | None
    scope: str
    expires_at: int
    updated_at: int
    version: int = 1


@frozen
class ImportBatch:
    """
    Records brought from another server (C{authsrv-admin import}), written by
    L{authsrv.interfaces.IImportStore.import_batch} in one transaction.
    """

    clients: tuple[Client, ...] = field(default=(), converter=_tuple)
    bans: tuple[Ban, ...] = field(default=(), converter=_tuple)
    linked: tuple[LinkedAccount, ...] = field(default=(), converter=_tuple)
    consents: tuple[Consent, ...] = field(default=(), converter=_tuple)
    grants: tuple[Grant, ...] = field(default=(), converter=_tuple)
    refresh_tokens: tuple[RefreshToken, ...] = field(default=(), converter=_tuple)


IMPORT_KINDS = ("clients", "bans", "linked", "consents", "grants", "refresh_tokens")
"""The fields of L{ImportBatch}, in the order they are written (grants before their tokens)."""


@frozen
class SourceChatLink:
    """
    A chat link as an identity backend holds it (L{authsrv.interfaces.IChatLinkSource}):
    tokens in plain form, never in a repr; C{version} changes on every write.
    """

    link_id: str
    provider_user_id: str
    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)
    scope: str
    expires_at: int
    version: int


@frozen
class KeyInfo:
    """
    Public facts about one signing key: never its private part.

    C{state} is one of C{"next"} (published, not yet signing), C{"active"}
    (signing) or C{"retired"} (published until C{expires_at}, then removed).
    """

    kid: str
    alg: str
    state: str
    created_at: int
    activated_at: int | None = None
    retired_at: int | None = None
    expires_at: int | None = None


@frozen
class Rotation:
    """
    What a rotation asked of a keystore did: C{rotated} is False when
    another process had just rotated and this one adopted its keys instead
    of rotating again, so whoever asked knows to ask again for one more.
    """

    keys: tuple[KeyInfo, ...]
    rotated: bool


@frozen
class AccessState:
    """What user-access needs from the store, in one round trip."""

    ban: Ban | None
    has_active_grant: bool


@frozen
class TotpFactor:
    """
    A user's confirmed TOTP authenticator (RFC 6238): C{secret_enc} is its
    secret sealed with a server key, C{last_step} the latest time step a
    code was accepted for, so no code is accepted twice.
    """

    sub: str
    secret_enc: bytes
    created_at: int
    last_step: int


TOTP_FACTOR = "totp"
RECOVERY_FACTOR = "recovery"


@frozen
class Passkey:
    """
    A user's WebAuthn credential: its id (base64url), COSE public key and
    the sign counter last seen, whether it may be synced to other devices
    (C{backup_eligible}) and is (C{backup_state}), the transports the
    browser reported, and when it was registered and last used.
    """

    credential_id: str
    sub: str
    public_key: bytes
    sign_count: int
    backup_eligible: bool
    backup_state: bool
    transports: tuple[str, ...] = field(converter=_tuple)
    created_at: int
    last_used: int | None = None


@frozen
class Factor:
    """
    One second factor of a user, as a list of them shows it: its C{kind}
    (L{TOTP_FACTOR}, L{RECOVERY_FACTOR}), when it was made, and for
    recovery codes how many are left.
    """

    kind: str
    created_at: int
    remaining: int | None = None


# Results of the atomic store operations.


@frozen
class Rotated:
    """The refresh token was active; its successor is now stored."""


@frozen
class Replayed:
    """
    The token was rotated moments ago (inside the grace window): answer with
    the same successor response again, never a new pair.
    """

    replay: bytes


@frozen
class Reused:
    """
    The token was rotated before the grace window: the whole family (grant)
    has been revoked by the same atomic operation.
    """

    grant_id: str


@frozen
class RefreshNotFound:
    """Unknown, expired or revoked refresh token."""


@frozen
class RevokedRefresh:
    """A refresh token was revoked, and with it its grant."""

    grant_id: str


@frozen
class RevokedAccess:
    """An access token was revoked."""

    grant_id: str


@frozen
class NotRevoked:
    """No token of that client matched: nothing was revoked."""


# Login throttling (docs/design.md, Brute force).


@frozen
class ThrottlePolicy:
    """
    How many failed logins may be made in C{window} seconds: per (account,
    client address) before each further attempt waits a delay doubling from
    one second up to C{max_delay}; per address over all accounts and per
    account from everywhere before attempts wait for the oldest failure to
    leave the window. A known device is never held back by the account's
    limit, so a distributed attack cannot keep the real user out.
    """

    failures_per_pair: int = 5
    failures_per_address: int = 50
    failures_per_account: int = 100
    window: int = 15 * 60
    max_delay: int = 15 * 60
    checks_in_flight: int = 32
    """Password checks one instance runs or queues at once; past it, logins answer 503 at once."""
    checks_per_address: int = 4
    """Password checks of one client address at once; past it, 429 at once."""


@frozen
class ThrottleDecision:
    """
    The answer to a login attempt: C{wait} is None when the attempt may go
    ahead (it is then counted as a failure, C{ticket} naming it, until the
    caller forgives it or reports success), else the seconds to wait
    (C{ticket} None: a refused attempt is not counted).
    """

    wait: int | None
    ticket: int | None

    @property
    def allowed(self) -> bool:
        return self.wait is None


DEVICE_PENDING = "pending"
DEVICE_APPROVED = "approved"
DEVICE_DENIED = "denied"
DEVICE_REDEEMED = "redeemed"


@frozen
class DeviceAuthorization:
    """
    A device authorization request (RFC 8628 section 3.1), under the hashes
    of its device code and user code. It moves once from C{pending} to
    C{approved} (C{grant_id} and C{sub} set: the grant was stored then) or
    C{denied}, and an approved one once to C{redeemed}, in the step that
    stores its tokens. C{poll_interval} is the polling interval the device
    was told, raised by C{slow_down}; C{polled_at} is when it last polled.
    """

    device_code_hash: str
    user_code_hash: str
    client_id: str
    scope: frozenset[str] = field(converter=_frozenset)
    resource: tuple[str, ...] = field(converter=_tuple)
    created_at: int
    expires_at: int
    poll_interval: int
    status: str = DEVICE_PENDING
    polled_at: int | None = None
    sub: str | None = None
    grant_id: str | None = None


POLL_PENDING = "authorization_pending"
POLL_SLOW_DOWN = "slow_down"
POLL_DENIED = "access_denied"
POLL_EXPIRED = "expired_token"
POLL_APPROVED = "approved"
"""Approved and not yet redeemed: its tokens are to be minted and stored as it is redeemed."""
POLL_REDEEMED = "redeemed"
"""The device code is used up now and its tokens are stored."""
POLL_REUSED = "reused"
"""The device code was redeemed before: a replay."""
POLL_UNKNOWN = "unknown"
"""No such device code, or it belongs to another client."""


@frozen
class DevicePoll:
    """What one poll of the token endpoint did to a device authorization (C{device} as it is now, if any)."""

    outcome: str
    device: DeviceAuthorization | None = None
