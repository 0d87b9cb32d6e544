"""
The store conformance suite.

Every store (SQLite, PostgreSQL, a third party's dropin) must behave the
same: the flows rely on the documented results of L{authsrv.interfaces.IStore}
and above all on its atomic steps. To run the suite, subclass
L{StoreConformance} in a C{Test*} class and define C{make_store()}, which
returns a new, empty store or a L{Deferred} of it; each test closes the store
it made. L{StoreConcurrencyConformance} races two stores on one database
(two servers): define C{make_store_pair()} returning both, or a Deferred of
the pair.

Times are plain integers around L{NOW}; nothing sleeps. The suite hands the
store only SHA-256 hashes, never a raw token, code or session id.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import pytest_twisted
from twisted.internet.defer import ensureDeferred, gatherResults, maybeDeferred
from twisted.internet.task import Clock
from zope.interface.verify import verifyObject

from authsrv.interfaces import IStore
from authsrv.operations.clients import ClientOperations
from authsrv.records import (
    CONSENT_STAGE,
    DEFAULT_GRANT_TYPES,
    IMPORT_KINDS,
    LOGIN_STAGE,
    MFA_STAGE,
    NOT_READ,
    AccessState,
    AccessToken,
    AuthorizationCode,
    AuthorizationRequest,
    Ban,
    BrowserSession,
    Client,
    Consent,
    Grant,
    ImportBatch,
    Interaction,
    LinkAttempt,
    PushedRequest,
    LinkedAccount,
    NotRevoked,
    Passkey,
    RefreshNotFound,
    RefreshToken,
    Replayed,
    Reused,
    RevokedAccess,
    RevokedRefresh,
    Rotated,
    ThrottleDecision,
    ThrottlePolicy,
    TotpFactor,
)
from authsrv.store.codes import CodeFound, CodeNotFound, CodeRedeemed, CodeReused
from authsrv.store.errors import AlreadyExists, AlreadyLinked
from authsrv.testing.device import TV, DeviceConcurrencyConformance, DeviceStoreConformance
from authsrv.testing.factors import FactorConcurrencyConformance, FactorStoreConformance
from authsrv.tokens import CLIENT_SECRET_KEY, client_secret_hash, token_hash

NOW = 1_700_000_000
HOUR = 3600
DAY = 86400
ALICE = "3f0c2a52-alice"
BOB = "3f0c2a52-bob"
CLIENT = "demo-app"
OTHER_CLIENT = "partner-app"
HERE, THERE = "192.0.2.1", "2001:db8::7"
"""Two client addresses."""
GRANT_CLIENTS = (CLIENT, OTHER_CLIENT, TV, "zeta-app", "other")
"""The clients the suite's grants name: a store starts a grant only for a stored client."""


def h(label: str) -> str:
    """The hash standing for the token, code or session id C{label}."""
    return token_hash(label)


def make_grant(grant_id: str, sub: str = ALICE, client_id: str = CLIENT, **changes) -> Grant:
    grant = Grant(
        grant_id=grant_id,
        client_id=client_id,
        sub=sub,
        scope={"openid", "profile", "offline_access"},
        resource=("https://api.example/",),
        auth_time=NOW - 30,
        sid="sid-" + grant_id,
        created_at=NOW,
        expires_at=NOW + 90 * DAY,
    )
    return attrs.evolve(grant, **changes)


def make_code(label: str, grant: Grant, expires_at: int = NOW + 60) -> AuthorizationCode:
    return AuthorizationCode(
        code_hash=h(label),
        grant_id=grant.grant_id,
        client_id=grant.client_id,
        sub=grant.sub,
        redirect_uri="https://app.example/callback?x=1",
        scope=grant.scope,
        code_challenge="E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
        code_challenge_method="S256",
        nonce="n-0S6_WzA2Mj",
        resource=grant.resource,
        auth_time=grant.auth_time,
        sid=grant.sid,
        issued_at=NOW,
        expires_at=expires_at,
    )


def make_interaction(interaction_id: str, stage: str = LOGIN_STAGE, expires_at: int = NOW + 600, **changes) -> Interaction:
    """An interaction whose request has every field set."""
    request = AuthorizationRequest(
        client_id=CLIENT,
        redirect_uri="https://app.example/callback?x=1",
        scope=("openid", "profile", "email"),
        state="å&b=c d",
        code_challenge="E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
        nonce="n-0S6_WzA2Mj",
        resources=("https://api.example/", "urn:chat"),
        prompt={"login", "consent"},
        max_age=0,
        login_hint="alice@example.com",
        hinted_sub=ALICE,
    )
    interaction = Interaction(
        interaction_id=interaction_id,
        stage=stage,
        request=request,
        csrf_token="csrf-" + interaction_id,
        created_at=NOW,
        expires_at=expires_at,
        sid="sid-1" if stage == CONSENT_STAGE else None,
    )
    return attrs.evolve(interaction, **changes)


def make_pushed(label: str, client_id: str = CLIENT, expires_at: int = NOW + 60) -> PushedRequest:
    """A pushed request whose query has a repeated parameter and text that needs escaping."""
    return PushedRequest(
        uri_hash=h("urn:ietf:params:oauth:request_uri:" + label), client_id=client_id,
        query="response_type=code&state=%C3%A5%26b%3Dc+d&resource=https%3A%2F%2Fapi.example%2F&resource=urn%3Achat",
        created_at=NOW, expires_at=expires_at,
    )


def make_link_attempt(label: str, session: str = "cookie-1", expires_at: int = NOW + 600, **changes) -> LinkAttempt:
    attempt = LinkAttempt(
        state_hash=h("state-" + label),
        sub=ALICE,
        session_hash=h(session),
        created_at=NOW,
        expires_at=expires_at,
        code_verifier="dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk",
    )
    return attrs.evolve(attempt, **changes)


def make_access(label: str, grant: Grant, expires_at: int = NOW + HOUR, **changes) -> AccessToken:
    access = AccessToken(
        token_hash=h(label),
        grant_id=grant.grant_id,
        client_id=grant.client_id,
        sub=grant.sub,
        scope=grant.scope,
        audience=grant.resource,
        issued_at=NOW,
        expires_at=expires_at,
    )
    return attrs.evolve(access, **changes)


def make_refresh(label: str, grant: Grant, expires_at: int = NOW + 30 * DAY) -> RefreshToken:
    return RefreshToken(
        token_hash=h(label),
        grant_id=grant.grant_id,
        client_id=grant.client_id,
        sub=grant.sub,
        scope=grant.scope,
        issued_at=NOW,
        expires_at=expires_at,
    )


def make_linked(account_id: str = "acct-1", sub: str = ALICE, provider: str = "discord", **changes) -> LinkedAccount:
    account = LinkedAccount(
        account_id=account_id,
        sub=sub,
        provider=provider,
        provider_user_id="80351110224678912",
        access_token_enc=b"\x00enc-access\xff",
        refresh_token_enc=b"\x01enc-refresh\xfe",
        scope="identify guilds.join",
        expires_at=NOW + 7 * DAY,
        updated_at=NOW,
    )
    return attrs.evolve(account, **changes)


SHARED_LINKS = (
    ("acct-old", ALICE, "discord", "80351110224678912", NOW),
    ("acct-new", BOB, "discord", "80351110224678912", NOW + 5),
    ("acct-tie-a", "user-c", "discord", "175928847299117063", NOW),
    ("acct-tie-b", "user-d", "discord", "175928847299117063", NOW),
    ("acct-alone", "user-e", "discord", "999", NOW),
    ("acct-slack", "user-f", "slack", "80351110224678912", NOW),
)
"""
Links an older schema let users share (account_id, sub, provider,
provider_user_id, updated_at), for a store's upgrade test: the upgrade
keeps L{KEPT_LINKS}, the most recently updated link of each provider
account, the greater account_id on a tie.
"""

KEPT_LINKS = {
    (ALICE, "discord"): None, (BOB, "discord"): "acct-new", ("user-c", "discord"): None,
    ("user-d", "discord"): "acct-tie-b", ("user-e", "discord"): "acct-alone", ("user-f", "slack"): "acct-slack",
}


async def kept_links(store) -> dict:
    """Each L{KEPT_LINKS} user's link id after the upgrade, or None."""
    found = {key: await store.get_linked_account(*key) for key in KEPT_LINKS}
    return {key: None if link is None else link.account_id for key, link in found.items()}


OLDER_ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("clients", dict(
        client_id=CLIENT, secret_hash=h("secret"), redirect_uris=["https://app.example/cb"],
        post_logout_redirect_uris=[], name="Demo", end_session_enabled=False, first_party=False, resources=[],
        introspect_any=False, backchannel_logout_uri=None, created_at=NOW,
        grant_types=["authorization_code", "refresh_token"])),
    ("browser_sessions", dict(
        session_hash=h("cookie-1"), sid="sid-g1", sub=ALICE, auth_time=NOW - 30, created_at=NOW - 30,
        expires_at=NOW + DAY)),
    ("grants", dict(
        grant_id="g1", client_id=CLIENT, sub=ALICE, scope="openid profile offline_access",
        resource=["https://api.example/"], auth_time=NOW - 30, sid="sid-g1", created_at=NOW,
        expires_at=NOW + 90 * DAY, revoked_at=None)),
    ("grants", dict(
        grant_id="g2", client_id=CLIENT, sub=ALICE, scope="openid", resource=[], auth_time=NOW - 30, sid="sid-g1",
        created_at=NOW, expires_at=NOW + 90 * DAY, revoked_at=None)),
    ("access_tokens", dict(
        token_hash=h("access-1"), grant_id="g1", client_id=CLIENT, sub=ALICE, scope="openid profile offline_access",
        audience=["https://api.example/"], jti=None, issued_at=NOW, expires_at=NOW + HOUR, revoked_at=None)),
    ("refresh_tokens", dict(
        token_hash=h("refresh-1"), grant_id="g1", client_id=CLIENT, sub=ALICE, scope="openid profile offline_access",
        issued_at=NOW, expires_at=NOW + 30 * DAY, consumed_at=None, grace_until=None, replay=None)),
    ("authorization_codes", dict(
        code_hash=h("code-g2"), grant_id="g2", client_id=CLIENT, sub=ALICE, redirect_uri="https://app.example/cb",
        scope="openid", code_challenge="E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM", code_challenge_method="S256",
        nonce=None, resource=[], auth_time=NOW - 30, sid="sid-g1", issued_at=NOW, expires_at=NOW + 60,
        used_at=None)),
    ("interactions", dict(
        interaction_id="i1", stage=LOGIN_STAGE, client_id=CLIENT, redirect_uri="https://app.example/cb",
        scope="openid profile", state="xyz", code_challenge="E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
        nonce=None, resources=[], prompt="", max_age=None, login_hint=None, csrf_token="csrf-i1", sid=None,
        created_at=NOW, expires_at=NOW + 600)),
    ("consents", dict(sub=ALICE, client_id=CLIENT, scope="openid profile offline_access", created_at=NOW)),
    ("bans", dict(sub=BOB, reason="spam", created_at=NOW, until=None)),
    ("linked_accounts", attrs.asdict(make_linked())),
    ("totp_factors", dict(sub=ALICE, secret_enc=b"sealed-secret", created_at=NOW, last_step=5)),
    ("passkeys", dict(
        credential_id="cred-1", sub=ALICE, public_key=b"cose-key", sign_count=7, backup_eligible=True,
        backup_state=False, transports=["internal", "hybrid"], created_at=NOW, last_used=None)),
)
"""
(table, row) as a release with the passkeys schema wrote them: a client, a
browser session, a live grant with its access and refresh tokens, a grant
whose code is not redeemed yet, a login under way, a consent, a ban, a linked account, a TOTP factor and a passkey. A store test
writes them into a database left at an older version in its own dialect
(lists as JSON text or arrays), each row with the columns its table had
then and none of the tables it did not have yet, then upgrades it and runs
L{check_older_rows}.
"""


async def check_older_rows(store, tables: set[str]) -> None:
    """Every one of L{OLDER_ROWS} written (in C{tables}) still works through the store after an upgrade."""
    grant = make_grant("g1")
    assert (await store.get_client(CLIENT)).redirect_uris == ("https://app.example/cb",)
    session = await store.get_session(h("cookie-1"), NOW)
    assert (session.sid, session.sub, session.amr, session.acr) == ("sid-g1", ALICE, ("pwd",), "urn:authsrv:acr:pwd")
    assert await store.get_grant("g1") == grant
    assert await store.find_access_token(h("access-1"), NOW) == make_access("access-1", grant)
    assert await store.access_state(ALICE, NOW) == AccessState(None, True)
    assert await store.rotate_refresh(
        h("refresh-1"), make_refresh("refresh-2", grant), make_access("access-2", grant), b"replay", NOW + 10, NOW + 1
    ) == Rotated()
    assert await store.rotate_refresh(
        h("refresh-1"), make_refresh("refresh-3", grant), make_access("access-3", grant), b"other", NOW + 11, NOW + 2
    ) == Replayed(b"replay")
    assert await store.find_access_token(h("access-2"), NOW + 1) == make_access("access-2", grant)
    assert await store.get_consent(ALICE, CLIENT) == grant.scope
    assert await store.list_user_consents(ALICE) == [Consent(ALICE, CLIENT, grant.scope, NOW)]
    assert await store.get_ban(BOB, NOW) == Ban(BOB, "spam", NOW)
    assert await store.access_state(BOB, NOW) == AccessState(Ban(BOB, "spam", NOW), False)
    assert await store.get_linked_account(ALICE, "discord") == make_linked()
    found = await store.find_code(h("code-g2"), NOW)
    assert (found.code.grant_id, found.grant.scope) == ("g2", frozenset({"openid"}))
    assert await store.redeem_code(
        h("code-g2"), make_access("access-g2", found.grant), make_refresh("refresh-g2", found.grant), NOW + 1
    ) == CodeRedeemed()
    if "interactions" in tables:
        interaction = await store.get_interaction("i1", NOW)
        assert (interaction.stage, interaction.request.scope, interaction.request.prompt) == (
            LOGIN_STAGE, ("openid", "profile"), frozenset())
    if "totp_factors" in tables:
        assert await store.get_totp(ALICE) == TotpFactor(ALICE, b"sealed-secret", NOW, 5)
    if "passkeys" in tables:
        assert await store.get_passkey("cred-1") == Passkey(
            "cred-1", ALICE, b"cose-key", 7, True, False, ("internal", "hybrid"), NOW)


async def _link_outcome(store, account: LinkedAccount) -> bool:
    """True when C{account} was linked, False when its provider account was linked to another user."""
    try:
        await store.link_account(account)
    except AlreadyLinked:
        return False
    return True


async def add_clients(store, client_ids) -> None:
    for client_id in client_ids:
        await store.add_client(Client(client_id, None, [f"https://{client_id}.example/cb"]))


async def start_grant(store, grant_id: str, sub: str = ALICE, client_id: str = CLIENT, **changes) -> Grant:
    """A grant as the authorize flow starts it: saved with its code (C{code-<id>}), its client stored if need be."""
    grant = make_grant(grant_id, sub, client_id, **changes)
    if await store.get_client(client_id) is None:
        await add_clients(store, (client_id,))
    assert await store.save_code(make_code("code-" + grant_id, grant), grant) is True
    return grant


async def page_templates(store) -> None:
    """
    One row of each list the admin API pages, for a store's own bulk copy
    to multiply (the tests that a page reads its rows alone): a ban, a
    client, a grant and a browser session named C{template}, Alice's, and a
    grant and a session named C{bobs}, Bob's.
    """
    await store.ban_user(Ban("template", None, NOW))
    await store.add_client(Client("template", None, ["https://rp.example/cb"]))
    await start_grant(store, "template", client_id="template")
    await start_grant(store, "bobs", sub=BOB, client_id="template")
    await store.create_session(BrowserSession("template", "template", ALICE, NOW, NOW, NOW + 3600))
    await store.create_session(BrowserSession("bobs", "bobs", BOB, NOW, NOW, NOW + 3600))


async def issue(
    store, grant: Grant, label: str, refresh: bool = True,
    access_expires_at: int = NOW + HOUR, refresh_expires_at: int = NOW + 30 * DAY,
) -> tuple:
    """
    Issue access token C{access-<label>} and, with C{refresh}, refresh token
    C{refresh-<label>}; fires with both records.
    """
    access = make_access("access-" + label, grant, access_expires_at)
    refresh_token = make_refresh("refresh-" + label, grant, refresh_expires_at) if refresh else None
    await store.issue_tokens(access, refresh_token)
    return access, refresh_token


class StoreConformance(FactorStoreConformance, DeviceStoreConformance):
    """
    Mixin of tests every L{IStore} must pass; see the module docstring for
    the C{make_store} hook.
    """

    def make_store(self):
        raise NotImplementedError("a conformance test class defines make_store()")

    @asynccontextmanager
    async def store(self, clients=GRANT_CLIENTS):
        """A new store holding C{clients}, closed after the test."""
        store = await maybeDeferred(self.make_store)
        try:
            await add_clients(store, clients)
            yield store
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_provides_interface(self):
        async with self.store() as store:
            assert verifyObject(IStore, store)
            assert await store.ping() is None

    # --- server keys -------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_server_key_is_made_once_and_kept(self):
        async with self.store() as store:
            key = await store.server_key("client-secrets")
            assert isinstance(key, bytes) and len(key) == 32
            assert await store.server_key("client-secrets") == key
            other = await store.server_key("another")
            assert len(other) == 32 and other != key
            assert await store.server_key("client-secrets") == key

    # --- clients -----------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_client_round_trip(self):
        client = Client(
            client_id=CLIENT,
            secret_hash=h("secret"),
            redirect_uris=("https://app.example/callback", "http://127.0.0.1:9000/cb"),
            post_logout_redirect_uris=("https://app.example/bye",),
            name="Démo app",
            end_session_enabled=True,
            first_party=True,
            resources=("https://api.example/", "urn:chat"),
            introspect_any=True,
            backchannel_logout_uri="https://app.example/logout",
            created_at=NOW,
        )
        public = Client(client_id=OTHER_CLIENT, secret_hash=None, redirect_uris=["https://partner.example/cb"],
                        source="registration", registration_token_hash=h("registration token"))
        async with self.store(clients=()) as store:
            assert await store.get_client(CLIENT) is None
            assert await store.add_client(client) is None
            await store.add_client(public)
            assert await store.get_client(CLIENT) == client
            assert await store.get_client(OTHER_CLIENT) == public
            assert (await store.get_client(OTHER_CLIENT)).is_public

    @pytest_twisted.ensureDeferred
    async def test_client_grant_types_round_trip_and_default(self):
        limited = Client(CLIENT, h("secret"), ["https://app.example/cb"], grant_types=["authorization_code"])
        default = Client(OTHER_CLIENT, None, ["https://partner.example/cb"])
        async with self.store(clients=()) as store:
            await store.add_client(limited)
            await store.put_client(default)
            assert (await store.get_client(CLIENT)).grant_types == ("authorization_code",)
            assert (await store.get_client(OTHER_CLIENT)).grant_types == DEFAULT_GRANT_TYPES
            none = attrs.evolve(limited, grant_types=())
            await store.put_client(none)
            assert await store.get_client(CLIENT) == none

    @pytest_twisted.ensureDeferred
    async def test_client_settings_round_trip_and_defaults(self):
        declared = Client(
            CLIENT, h("secret"), ["https://app.example/cb"], source="config", refresh_grace=0, rate_limit="20/s",
            audiences=["https://api.example", "https://files.example"],
            require_pushed_authorization_requests=True, profile="fapi2",
        )
        plain = Client(OTHER_CLIENT, None, ["https://partner.example/cb"])
        async with self.store(clients=()) as store:
            await store.put_client(declared)
            await store.add_client(plain)
            assert await store.get_client(CLIENT) == declared
            stored = await store.get_client(OTHER_CLIENT)
            assert (stored.source, stored.refresh_grace, stored.rate_limit, stored.audiences,
                    stored.registration_token_hash) == ("operator", None, None, (), None)
            assert (stored.require_pushed_authorization_requests, stored.profile) == (False, None)

    @pytest_twisted.ensureDeferred
    async def test_client_signing_algorithms_round_trip(self):
        chosen = Client(
            CLIENT, h("secret"), ["https://app.example/cb"], id_token_signed_response_alg="ES256",
            access_token_signed_response_alg="PS256", userinfo_signed_response_alg="EdDSA",
        )
        async with self.store(clients=()) as store:
            await store.add_client(chosen)
            await store.add_client(Client(OTHER_CLIENT, None, ["https://partner.example/cb"]))
            assert await store.get_client(CLIENT) == chosen
            plain = await store.get_client(OTHER_CLIENT)
            assert (
                plain.id_token_signed_response_alg, plain.access_token_signed_response_alg,
                plain.userinfo_signed_response_alg,
            ) == ("RS256", "RS256", None)
            changed = attrs.evolve(chosen, id_token_signed_response_alg="RS256", userinfo_signed_response_alg=None)
            await store.put_client(changed)
            assert await store.get_client(CLIENT) == changed

    @pytest_twisted.ensureDeferred
    async def test_client_authentication_settings_round_trip(self):
        jwks = '{"keys": [{"kty": "EC", "crv": "P-256", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",' \
               ' "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}'
        machine = Client(
            CLIENT, None, [], grant_types=["client_credentials"], token_endpoint_auth_method="private_key_jwt",
            jwks=jwks, scopes=["reports.read", "reports.write"],
        )
        remote = Client(OTHER_CLIENT, None, [], token_endpoint_auth_method="private_key_jwt",
                        jwks_uri="https://partner.example/jwks.json")
        async with self.store(clients=()) as store:
            await store.add_client(machine)
            await store.put_client(remote)
            assert await store.get_client(CLIENT) == machine
            assert await store.get_client(OTHER_CLIENT) == remote
            assert not (await store.get_client(CLIENT)).is_public

    @pytest_twisted.ensureDeferred
    async def test_a_sealed_client_secret_round_trips_and_goes_with_its_client(self):
        sealed = bytes(range(256)) + b"\x00 sealed"
        client = Client(CLIENT, h("secret"), [], grant_types=["client_credentials"],
                        token_endpoint_auth_method="client_secret_jwt", sealed_secret=sealed)
        async with self.store(clients=()) as store:
            await store.add_client(client)
            assert (await store.get_client(CLIENT)).sealed_secret == sealed
            resealed = attrs.evolve(client, sealed_secret=b"resealed")
            await store.put_client(resealed)
            assert await store.get_client(CLIENT) == resealed
            assert [c.sealed_secret for c in await store.list_clients() if c.client_id == CLIENT] == [b"resealed"]
            assert await store.remove_client(CLIENT)
            await store.add_client(attrs.evolve(client, sealed_secret=None))
            assert (await store.get_client(CLIENT)).sealed_secret is None

    @pytest_twisted.ensureDeferred
    async def test_client_assertion_jti_is_claimed_once_until_it_expires(self):
        async with self.store() as store:
            assert await store.claim_jti(CLIENT, "jti-1", NOW + 60, NOW) is True
            assert await store.claim_jti(CLIENT, "jti-1", NOW + 60, NOW + 30) is False
            assert await store.claim_jti(OTHER_CLIENT, "jti-1", NOW + 60, NOW) is True
            assert await store.claim_jti(CLIENT, "jti-1", NOW + 200, NOW + 60) is True
            assert await store.claim_jti(CLIENT, "jti-1", NOW + 200, NOW + 199) is False
            await store.gc(NOW + 200, 100)
            assert await store.claim_jti(CLIENT, "jti-1", NOW + 300, NOW + 200) is True

    @pytest_twisted.ensureDeferred
    async def test_a_grant_started_with_its_access_token(self):
        async with self.store() as store:
            grant = make_grant("cc1", sub="", scope={"reports.read"}, sid=None)
            access = make_access("cc-token", grant, jti="cc-jti", audience=("https://api.example/",))
            await store.start_grant(grant, access)
            assert await store.get_grant("cc1") == grant
            found = await store.find_access_token(h("cc-token"), NOW)
            assert found == access and not found.for_user
            assert await store.revoke_token(h("cc-token"), CLIENT, NOW) == RevokedAccess(grant.grant_id)
            assert await store.find_access_token(h("cc-token"), NOW) is None
            with pytest.raises(AlreadyExists):
                await store.start_grant(grant, make_access("cc-other", grant))

    @pytest_twisted.ensureDeferred
    async def test_client_previous_secret_round_trip(self):
        rotated = Client(
            CLIENT, h("new"), ["https://app.example/cb"], previous_secret_hash=h("old"),
            previous_secret_until=NOW + DAY,
        )
        async with self.store(clients=()) as store:
            await store.add_client(Client(OTHER_CLIENT, h("only"), ["https://partner.example/cb"]))
            assert (await store.get_client(OTHER_CLIENT)).previous_secret_hash is None
            assert (await store.get_client(OTHER_CLIENT)).previous_secret_until is None
            await store.put_client(rotated)
            assert await store.get_client(CLIENT) == rotated

    @pytest_twisted.ensureDeferred
    async def test_add_existing_client_fails(self):
        first = Client(CLIENT, h("one"), ["https://app.example/cb"])
        async with self.store(clients=()) as store:
            await store.add_client(first)
            with pytest.raises(AlreadyExists):
                await store.add_client(Client(CLIENT, h("two"), ["https://evil.example/cb"]))
            assert await store.get_client(CLIENT) == first

    @pytest_twisted.ensureDeferred
    async def test_put_client_inserts_and_replaces(self):
        async with self.store(clients=()) as store:
            await store.put_client(Client(CLIENT, h("one"), ["https://app.example/cb"]))
            replacement = Client(CLIENT, None, ["https://app.example/new"], name="renamed")
            await store.put_client(replacement)
            assert await store.get_client(CLIENT) == replacement
            assert await store.list_clients() == [replacement]

    @pytest_twisted.ensureDeferred
    async def test_a_client_is_changed_only_from_what_is_stored(self):
        read = Client(CLIENT, h("one"), ["https://app.example/cb"], name="app")
        renamed = attrs.evolve(read, name="renamed")
        rotated = attrs.evolve(read, secret_hash=h("two"))
        async with self.store(clients=()) as store:
            await store.add_client(read)
            assert await store.change_client(read, renamed) is True
            assert await store.get_client(CLIENT) == renamed
            await store.put_client(rotated)
            assert await store.change_client(renamed, attrs.evolve(renamed, name="stale")) is False
            assert await store.get_client(CLIENT) == rotated
            assert await store.remove_client(CLIENT)
            assert await store.change_client(rotated, renamed) is False
            assert await store.get_client(CLIENT) is None

    @pytest_twisted.ensureDeferred
    async def test_a_client_is_removed_as_expected_only_while_it_is_stored_so(self):
        read = Client(CLIENT, h("one"), ["https://app.example/cb"], name="app")
        rotated = attrs.evolve(read, secret_hash=h("two"))
        async with self.store(clients=()) as store:
            await store.add_client(read)
            await start_grant(store, "g-1", "sub-1", CLIENT)
            await store.put_client(rotated)
            assert await store.remove_client(CLIENT, read) is False
            assert await store.get_client(CLIENT) == rotated
            assert [g.grant_id for g in await store.list_user_grants("sub-1", 0)] == ["g-1"]
            assert await store.remove_client(CLIENT, rotated) is True
            assert await store.get_client(CLIENT) is None
            assert await store.list_user_grants("sub-1", 0) == []
            assert await store.remove_client(CLIENT, rotated) is False

    @pytest_twisted.ensureDeferred
    async def test_list_and_remove_clients(self):
        clients = [Client(name, None, [f"https://{name}.example/cb"]) for name in ("c", "a", "b")]
        async with self.store(clients=()) as store:
            assert await store.list_clients() == []
            for client in clients:
                await store.add_client(client)
            assert [c.client_id for c in await store.list_clients()] == ["a", "b", "c"]
            assert await store.remove_client("b") is True
            assert await store.remove_client("b") is False
            assert await store.get_client("b") is None
            assert [c.client_id for c in await store.list_clients()] == ["a", "c"]

    @pytest_twisted.ensureDeferred
    async def test_clients_are_listed_a_page_at_a_time_in_code_point_order(self):
        ids = ["B", "a", "b", "\u00e9", "\uff5a"]
        async with self.store(clients=()) as store:
            for client_id in reversed(ids):
                await store.add_client(Client(client_id, None, ["https://rp.example/cb"]))
            assert [c.client_id for c in await store.list_clients()] == ids
            assert [c.client_id for c in await store.list_clients(limit=2)] == ids[:2]
            assert [c.client_id for c in await store.list_clients("a", 2)] == ids[2:4]
            assert [c.client_id for c in await store.list_clients("ab", 10)] == ids[2:]
            assert await store.list_clients("\uff5a", 10) == []

    @pytest_twisted.ensureDeferred
    async def test_clients_are_counted_by_source(self):
        clients = [Client(name, None, [f"https://{name}.example/cb"], source=source)
                   for name, source in (("a", "registration"), ("b", "operator"), ("c", "registration"))]
        async with self.store(clients=()) as store:
            assert await store.count_clients("registration") == 0
            for client in clients:
                await store.add_client(client)
            await store.put_client(attrs.evolve(clients[1], name="renamed"))
            assert await store.count_clients("registration") == 2
            assert await store.count_clients("operator") == 1
            assert await store.count_clients("config") == 0
            assert await store.remove_client("a") is True
            assert await store.count_clients("registration") == 1

    @pytest_twisted.ensureDeferred
    async def test_clients_are_listed_by_source(self):
        clients = [Client(name, None, [f"https://{name}.example/cb"], source=source)
                   for name, source in (("d", "config"), ("a", "registration"), ("c", "operator"), ("b", "operator"))]
        async with self.store(clients=()) as store:
            assert await store.list_clients_of(("config", "operator")) == []
            for client in clients:
                await store.add_client(client)
            await store.put_client(attrs.evolve(clients[2], name="renamed"))
            assert await store.list_clients_of(("config", "operator")) == [
                clients[3], attrs.evolve(clients[2], name="renamed"), clients[0]]
            assert await store.list_clients_of(("registration",)) == [clients[1]]
            assert await store.list_clients_of(("document",)) == []

    @pytest_twisted.ensureDeferred
    async def test_removing_a_client_removes_its_grants_tokens_and_consents(self):
        async with self.store(clients=()) as store:
            for client_id in (CLIENT, "other"):
                await store.add_client(Client(client_id, None, [f"https://{client_id}.example/cb"]))
            gone = await start_grant(store, "g1")
            await issue(store, gone, "gone")
            await start_grant(store, "g2")
            kept = await start_grant(store, "g3", client_id="other")
            kept_access, kept_refresh = await issue(store, kept, "kept")
            await store.save_consent(ALICE, CLIENT, {"openid"}, NOW)
            await store.save_consent(ALICE, "other", {"openid"}, NOW)

            assert await store.remove_client(CLIENT) is True

            assert await store.get_grant("g1") is None
            assert await store.find_access_token(h("access-gone"), NOW) is None
            assert await store.get_refresh_token(h("refresh-gone")) is None
            assert await store.find_code(h("code-g2"), NOW) == CodeNotFound()
            assert await store.get_consent(ALICE, CLIENT) is None
            assert await store.get_grant("g3") == kept
            assert (await store.find_access_token(h("access-kept"), NOW)).token_hash == kept_access.token_hash
            assert await store.get_refresh_token(h("refresh-kept")) == kept_refresh
            assert await store.get_consent(ALICE, "other") == frozenset({"openid"})

    @pytest_twisted.ensureDeferred
    async def test_no_grant_starts_for_a_client_not_stored(self):
        """
        An instance may still hold a removed client in its cache: the store,
        not the cache, decides, and starts no grant (so issues no token) for it.
        """
        async with self.store(clients=[CLIENT]) as store:
            assert await store.remove_client(CLIENT) is True
            for client_id in (CLIENT, "never-stored"):
                grant = make_grant("g-" + client_id, client_id=client_id)
                assert await store.save_code(make_code("code-" + client_id, grant), grant) is False
                assert await store.find_code(h("code-" + client_id), NOW) == CodeNotFound()
                machine = make_grant("cc-" + client_id, sub="", client_id=client_id, sid=None)
                assert await store.start_grant(machine, make_access("cc-" + client_id, machine)) is False
                assert await store.find_access_token(h("cc-" + client_id), NOW) is None
                for grant_id in ("g-", "cc-"):
                    assert await store.get_grant(grant_id + client_id) is None
            assert await store.list_user_grants(ALICE, NOW) == []
            await add_clients(store, [CLIENT])
            grant = make_grant("g-back")
            assert await store.save_code(make_code("code-back", grant), grant) is True
            assert (await store.find_code(h("code-back"), NOW)).grant == grant
            described = make_grant("g-described", client_id="https://app.example/client.json")
            code = make_code("code-described", described)
            assert await store.save_code(code, described, stored_client=False) is True
            assert (await store.find_code(h("code-described"), NOW)).grant == described

    # --- browser sessions, interactions and link attempts ---------------------

    @pytest_twisted.ensureDeferred
    async def test_session_round_trip_and_expiry(self):
        session = BrowserSession(h("cookie-1"), "sid-1", ALICE, NOW - 5, NOW, NOW + 14 * DAY)
        async with self.store() as store:
            await store.create_session(session)
            assert await store.get_session(h("cookie-1"), NOW) == session
            assert await store.get_session(h("cookie-1"), session.expires_at - 1) == session
            assert await store.get_session(h("cookie-1"), session.expires_at) is None
            assert await store.get_session(h("cookie-2"), NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_end_session(self):
        session = BrowserSession(h("cookie-1"), "sid-1", ALICE, NOW, NOW, NOW + DAY)
        async with self.store() as store:
            await store.create_session(session)
            assert await store.end_session(h("cookie-1")) == session
            assert await store.end_session(h("cookie-1")) is None
            assert await store.get_session(h("cookie-1"), NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_end_user_sessions(self):
        async with self.store() as store:
            for n, sub in enumerate((ALICE, ALICE, BOB)):
                await store.create_session(BrowserSession(h(f"cookie-{n}"), f"sid-{n}", sub, NOW, NOW, NOW + DAY))
            ended = await store.end_user_sessions(ALICE)
            assert sorted(session.sid for session in ended) == ["sid-0", "sid-1"]
            assert all(isinstance(session, BrowserSession) and session.sub == ALICE for session in ended)
            assert await store.end_user_sessions(ALICE) == []
            assert await store.get_session(h("cookie-0"), NOW) is None
            assert (await store.get_session(h("cookie-2"), NOW)).sub == BOB

    @pytest_twisted.ensureDeferred
    async def test_list_user_sessions(self):
        sessions = [
            BrowserSession(h("cookie-late"), "sid-late", ALICE, NOW, NOW + 5, NOW + DAY),
            BrowserSession(h("cookie-early"), "sid-early", ALICE, NOW, NOW, NOW + DAY),
            BrowserSession(h("cookie-ending"), "sid-ending", ALICE, NOW, NOW + 1, NOW + 10),
            BrowserSession(h("cookie-bob"), "sid-bob", BOB, NOW, NOW, NOW + DAY),
        ]
        async with self.store() as store:
            assert await store.list_user_sessions(ALICE, NOW) == []
            for session in sessions:
                await store.create_session(session)
            assert [s.sid for s in await store.list_user_sessions(ALICE, NOW)] == ["sid-early", "sid-ending", "sid-late"]
            assert await store.list_user_sessions(ALICE, NOW + 10) == [sessions[1], sessions[0]]
            assert await store.list_user_sessions(BOB, NOW) == [sessions[3]]

    @pytest_twisted.ensureDeferred
    async def test_user_sessions_are_listed_a_page_at_a_time_by_their_public_sid(self):
        """
        Pages of a user's sessions go on after the last (created_at, sid)
        shown, by code point, skipping expired ones: the cursor names the
        public sid, never the session_hash (which a cookie is checked by).
        """
        async with self.store() as store:
            sessions = [BrowserSession(h(f"cookie-{sid}"), sid, ALICE, NOW, at, NOW + DAY) for sid, at in (
                ("s-b", NOW), ("s-a", NOW), ("s-\u00e9", NOW), ("s-B", NOW + 1), ("s-0", NOW + 2))]
            for session in sessions:
                await store.create_session(session)
            await store.create_session(BrowserSession(h("cookie-bob"), "s-bob", BOB, NOW, NOW + 1, NOW + DAY))
            await store.create_session(BrowserSession(h("cookie-old"), "s-old", ALICE, NOW, NOW + 1, NOW + 1))
            ordered = [sessions[1], sessions[0], sessions[2], sessions[3], sessions[4]]
            assert await store.list_user_sessions(ALICE, NOW + 1, None, 2) == ordered[:2]
            assert await store.list_user_sessions(ALICE, NOW + 1, (NOW, "s-b"), 2) == ordered[2:4]
            assert await store.list_user_sessions(ALICE, NOW + 1, (NOW, "s-c"), 10) == ordered[2:]
            assert await store.list_user_sessions(ALICE, NOW + 1, (NOW + 1, "s-B"), 10) == ordered[4:]
            assert await store.list_user_sessions(ALICE, NOW + 1, (NOW + 2, "s-0")) == []
            await store.end_session(sessions[0].session_hash)
            assert await store.list_user_sessions(ALICE, NOW + 1, (NOW, "s-b"), 1) == ordered[2:3]

    @pytest_twisted.ensureDeferred
    async def test_interaction_round_trip_and_expiry(self):
        full = make_interaction("ia-1", CONSENT_STAGE)
        bare = make_interaction(
            "ia-2",
            request=AuthorizationRequest(CLIENT, "https://app.example/cb", (), "", "challenge"),
        )
        async with self.store() as store:
            assert await store.save_interaction(full) is None
            await store.save_interaction(bare)
            assert await store.get_interaction("ia-1", NOW) == full
            assert await store.get_interaction("ia-1", NOW + 599) == full
            assert await store.get_interaction("ia-1", NOW + 600) is None
            assert await store.get_interaction("ia-3", NOW) is None
            got = await store.get_interaction("ia-2", NOW)
            assert got == bare
            assert (got.sid, got.request.nonce, got.request.max_age, got.request.login_hint,
                    got.request.hinted_sub) == (None,) * 5
            assert (got.request.scope, got.request.resources, got.request.prompt) == ((), (), frozenset())

    @pytest_twisted.ensureDeferred
    async def test_interaction_keeps_the_user_its_id_token_hint_named(self):
        """The sign-in a hint asks for may end with a code only for that user (OIDC Core section 3.1.2.1)."""
        waiting = make_interaction("ia-1", address=HERE)
        stepping_up = make_interaction("ia-2", MFA_STAGE, sid="sid-1", sub=ALICE, amr=("pwd",))
        async with self.store() as store:
            await store.save_login_interaction(waiting, 3)
            await store.save_interaction(stepping_up)
            for saved in (waiting, stepping_up):
                got = await store.get_interaction(saved.interaction_id, NOW)
                assert got.request.hinted_sub == ALICE and got == saved

    @pytest_twisted.ensureDeferred
    async def test_login_interaction_keeps_its_address(self):
        waiting = make_interaction("ia-1", address=THERE)
        async with self.store() as store:
            assert await store.save_login_interaction(waiting, 3) is None
            assert await store.get_interaction("ia-1", NOW) == waiting
            assert await store.take_interaction("ia-1", LOGIN_STAGE) is True

    @pytest_twisted.ensureDeferred
    async def test_login_interactions_capped_per_address(self):
        async with self.store() as store:
            for n in range(3):
                waiting = make_interaction(f"here-{n}", address=HERE, expires_at=NOW + 600 + n)
                assert await store.save_login_interaction(waiting, 3) is None
            refused = make_interaction("here-3", address=HERE, created_at=NOW + 5)
            assert await store.save_login_interaction(refused, 3) == NOW + 600
            assert await store.get_interaction("here-3", NOW) is None
            assert await store.save_login_interaction(make_interaction("there-0", address=THERE), 3) is None
            assert await store.take_interaction("here-1", LOGIN_STAGE) is True
            assert await store.save_login_interaction(refused, 3) is None
            assert await store.get_interaction("here-3", NOW) == refused

    @pytest_twisted.ensureDeferred
    async def test_login_interaction_cap_counts_only_live_login_stage_ones(self):
        async with self.store() as store:
            await store.save_login_interaction(make_interaction("old", address=HERE, expires_at=NOW + 10), 2)
            await store.save_interaction(make_interaction("consent", CONSENT_STAGE, address=HERE))
            await store.save_interaction(make_interaction("anonymous"))
            assert await store.save_login_interaction(make_interaction("new", address=HERE), 2) is None
            late = make_interaction("late", address=HERE, created_at=NOW + 10, expires_at=NOW + 700)
            assert await store.save_login_interaction(late, 2) is None
            assert await store.save_login_interaction(make_interaction("over", address=HERE), 2) == NOW + 600
            assert await store.save_login_interaction(make_interaction("one", address=THERE), 1) is None
            assert await store.save_login_interaction(make_interaction("two", address=THERE), 1) == NOW + 600

    @pytest_twisted.ensureDeferred
    async def test_interaction_keeps_scope_order(self):
        interaction = make_interaction("ia-1")
        reordered = attrs.evolve(interaction, request=attrs.evolve(interaction.request, scope=("profile", "openid")))
        async with self.store() as store:
            await store.save_interaction(reordered)
            assert (await store.get_interaction("ia-1", NOW)).request.scope == ("profile", "openid")

    @pytest_twisted.ensureDeferred
    async def test_save_existing_interaction_fails(self):
        async with self.store() as store:
            await store.save_interaction(make_interaction("ia-1"))
            with pytest.raises(AlreadyExists):
                await store.save_interaction(make_interaction("ia-1", CONSENT_STAGE))
            assert (await store.get_interaction("ia-1", NOW)).stage == LOGIN_STAGE

    @pytest_twisted.ensureDeferred
    async def test_take_interaction_only_at_its_stage(self):
        async with self.store() as store:
            await store.save_interaction(make_interaction("ia-1", LOGIN_STAGE))
            assert await store.take_interaction("ia-1", CONSENT_STAGE) is False
            assert await store.get_interaction("ia-1", NOW) == make_interaction("ia-1", LOGIN_STAGE)
            assert await store.take_interaction("ia-1", LOGIN_STAGE) is True
            assert await store.take_interaction("ia-1", LOGIN_STAGE) is False
            assert await store.get_interaction("ia-1", NOW) is None
            assert await store.take_interaction("ia-unknown", LOGIN_STAGE) is False

    @pytest_twisted.ensureDeferred
    async def test_racing_takes_of_an_interaction(self):
        async with self.store() as store:
            for n in range(5):
                await store.save_interaction(make_interaction(f"ia-{n}", CONSENT_STAGE))
                results = await gatherResults([store.take_interaction(f"ia-{n}", CONSENT_STAGE) for _ in range(2)])
                assert sorted(results) == [False, True]

    @pytest_twisted.ensureDeferred
    async def test_link_attempt_is_taken_once(self):
        attempt = make_link_attempt("1")
        async with self.store() as store:
            assert await store.save_link_attempt(attempt) is None
            assert await store.take_link_attempt(h("state-1"), h("cookie-1"), NOW + 599) == attempt
            assert await store.take_link_attempt(h("state-1"), h("cookie-1"), NOW) is None
            assert await store.take_link_attempt(h("state-2"), h("cookie-1"), NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_link_attempt_of_another_session_is_left_alone(self):
        attempt = make_link_attempt("1", code_verifier=None)
        async with self.store() as store:
            await store.save_link_attempt(attempt)
            assert await store.take_link_attempt(h("state-1"), h("cookie-2"), NOW) is None
            assert await store.take_link_attempt(h("state-1"), h("cookie-1"), NOW) == attempt

    @pytest_twisted.ensureDeferred
    async def test_expired_link_attempt_is_not_taken(self):
        async with self.store() as store:
            await store.save_link_attempt(make_link_attempt("1", expires_at=NOW + 10))
            assert await store.take_link_attempt(h("state-1"), h("cookie-1"), NOW + 10) is None
            with pytest.raises(AlreadyExists):
                await store.save_link_attempt(make_link_attempt("1"))

    # --- pushed authorization requests ----------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_pushed_request_is_taken_once(self):
        pushed = make_pushed("1")
        async with self.store() as store:
            assert await store.save_pushed_request(pushed) is None
            assert await store.take_pushed_request(pushed.uri_hash, CLIENT, NOW + 59) == pushed
            assert await store.take_pushed_request(pushed.uri_hash, CLIENT, NOW) is None
            assert await store.take_pushed_request(h("unknown"), CLIENT, NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_pushed_request_of_another_client_is_left_alone(self):
        pushed = make_pushed("1")
        async with self.store() as store:
            await store.save_pushed_request(pushed)
            assert await store.take_pushed_request(pushed.uri_hash, OTHER_CLIENT, NOW) is None
            assert await store.take_pushed_request(pushed.uri_hash, CLIENT, NOW) == pushed

    @pytest_twisted.ensureDeferred
    async def test_expired_pushed_request_is_not_taken_and_is_housekept(self):
        async with self.store() as store:
            for n, expires_at in enumerate((NOW - 1, NOW, NOW + 1)):
                await store.save_pushed_request(make_pushed(f"{n}", expires_at=expires_at))
            assert await store.take_pushed_request(make_pushed("1").uri_hash, CLIENT, NOW) is None
            with pytest.raises(AlreadyExists):
                await store.save_pushed_request(make_pushed("1"))
            assert await store.gc(NOW, 100) == 2
            assert [await store.take_pushed_request(make_pushed(f"{n}").uri_hash, CLIENT, NOW - 2) for n in range(3)] == [
                None, None, make_pushed("2", expires_at=NOW + 1),
            ]

    # --- codes ---------------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_a_found_code_redeems_once_with_its_tokens(self):
        async with self.store() as store:
            grant = make_grant("g1")
            code = make_code("code-1", grant)
            await store.save_code(code, grant)
            assert await store.get_grant("g1") == grant
            # Finding changes nothing.
            assert await store.find_code(h("code-1"), NOW) == CodeFound(code, grant)
            assert await store.find_code(h("code-1"), NOW) == CodeFound(code, grant)
            access, refresh = make_access("access-1", grant), make_refresh("refresh-1", grant)
            assert await store.redeem_code(h("code-1"), access, refresh, NOW) == CodeRedeemed()
            assert await store.find_access_token(access.token_hash, NOW) == access
            assert await store.get_refresh_token(refresh.token_hash) == refresh
            assert await store.find_code(h("code-1"), NOW + 1) == CodeReused("g1", CLIENT)
            assert await store.find_code(h("code-2"), NOW) == CodeNotFound()

    @pytest_twisted.ensureDeferred
    async def test_redeeming_a_used_code_revokes_its_grant_and_stores_nothing(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            first = make_access("access-1", grant)
            assert await store.redeem_code(h("code-g1"), first, None, NOW) == CodeRedeemed()
            again = make_access("access-2", grant)
            assert await store.redeem_code(h("code-g1"), again, make_refresh("refresh-2", grant), NOW + 1) == (
                CodeReused("g1")
            )
            assert (await store.get_grant("g1")).revoked_at == NOW + 1
            assert await store.find_access_token(first.token_hash, NOW + 1) is None
            assert await store.find_access_token(again.token_hash, NOW + 1) is None
            assert await store.get_refresh_token(h("refresh-2")) is None
            assert await store.find_code(h("code-g1"), NOW + 2) == CodeReused("g1", CLIENT)

    @pytest_twisted.ensureDeferred
    async def test_unknown_code_is_not_redeemed(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            access = make_access("access-1", grant)
            assert await store.redeem_code(h("code-2"), access, None, NOW) == CodeNotFound()
            assert await store.find_access_token(access.token_hash, NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_a_found_code_and_a_refresh_lookup_bring_the_grant_and_the_ban(self):
        async with self.store() as store:
            grant = attrs.evolve(make_grant("g1"), amr=("pwd", "otp"), acr="urn:mfa", resource=("https://api.example/",),
                                 sid="sid-1")
            await store.save_code(make_code("code-1", grant), grant)
            await store.ban_user(Ban(ALICE, "spam", NOW, until=NOW + 60))
            found = await store.find_code(h("code-1"), NOW)
            assert (found.grant, found.user_ban) == (grant, Ban(ALICE, "spam", NOW, until=NOW + 60))
            refresh = make_refresh("refresh-1", grant)
            await store.issue_tokens(make_access("access-1", grant), refresh)
            found = await store.get_refresh_token(refresh.token_hash)
            assert found.grant == grant and found.user_ban == Ban(ALICE, "spam", NOW, until=NOW + 60)

    @pytest_twisted.ensureDeferred
    async def test_code_expires_at_its_expiry(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            access = make_access("access-1", grant)
            assert await store.find_code(h("code-g1"), NOW + 60) == CodeNotFound()
            assert await store.redeem_code(h("code-g1"), access, None, NOW + 60) == CodeNotFound()
            assert await store.find_access_token(access.token_hash, NOW) is None
            assert await store.find_code(h("code-g1"), NOW + 59) == CodeFound(make_code("code-g1", grant), grant)
            assert await store.redeem_code(h("code-g1"), access, None, NOW + 59) == CodeRedeemed()

    @pytest_twisted.ensureDeferred
    async def test_code_of_revoked_grant_is_not_found(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            assert await store.revoke_user_grants(ALICE, NOW) == 1
            assert await store.find_code(h("code-g1"), NOW) == CodeNotFound()
            assert await store.redeem_code(h("code-g1"), make_access("access-1", grant), None, NOW) == CodeNotFound()
            assert await store.find_access_token(h("access-1"), NOW) is None
            # Left unused: it is still no reuse.
            assert await store.find_code(h("code-g1"), NOW) == CodeNotFound()

    @pytest_twisted.ensureDeferred
    async def test_a_refused_code_is_used_up_with_its_grant(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            other = await start_grant(store, "g2")
            await store.refuse_code(h("code-g1"), NOW)
            assert await store.find_code(h("code-g1"), NOW) == CodeReused("g1", CLIENT)
            assert (await store.get_grant("g1")).revoked_at == NOW
            assert await store.redeem_code(h("code-g1"), make_access("access-1", grant), None, NOW) == CodeReused("g1")
            await store.refuse_code(h("code-g1"), NOW + 1)
            assert (await store.get_grant("g1")).revoked_at == NOW
            await store.refuse_code(h("code-none"), NOW)
            assert await store.find_code(h("code-g2"), NOW) == CodeFound(make_code("code-g2", other), other)

    @pytest_twisted.ensureDeferred
    async def test_a_redeemed_code_refused_revokes_what_it_issued(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            access = make_access("access-1", grant)
            assert await store.redeem_code(h("code-g1"), access, None, NOW) == CodeRedeemed()
            await store.refuse_code(h("code-g1"), NOW + 1)
            assert await store.find_access_token(access.token_hash, NOW + 1) is None
            assert await store.find_code(h("code-g1"), NOW + 1) == CodeReused("g1", CLIENT)

    @pytest_twisted.ensureDeferred
    async def test_save_code_of_existing_grant_fails_whole(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            with pytest.raises(AlreadyExists):
                await store.save_code(make_code("code-other", grant), grant)
            assert await store.find_code(h("code-other"), NOW) == CodeNotFound()

    # --- grants and tokens ------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_access_token_round_trip_and_expiry(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            assert await store.get_grant("g1") == grant
            assert await store.get_grant("g2") is None
            jwt = make_access("jwt-1", grant, jti="jti-1", audience=("https://api.example/", "urn:chat"))
            await store.issue_tokens(jwt, None)
            assert await store.find_access_token(h("jwt-1"), NOW) == jwt
            assert await store.find_access_token(h("jwt-1"), jwt.expires_at - 1) == jwt
            assert await store.find_access_token(h("jwt-1"), jwt.expires_at) is None
            assert await store.find_access_token(h("jwt-2"), NOW) is None
            assert await store.get_refresh_token(h("jwt-1")) is None

    @pytest_twisted.ensureDeferred
    async def test_dpop_bindings_round_trip(self):
        client = Client(CLIENT, None, ["https://app.example/cb"], dpop_bound_access_tokens=True)
        async with self.store(clients=()) as store:
            await store.add_client(client)
            grant = make_grant("g1")
            code = attrs.evolve(make_code("code-g1", grant), dpop_jkt="k" * 43)
            await store.save_code(code, grant)
            assert (await store.find_code(h("code-g1"), NOW)).code == code
            access = make_access("access-1", grant, jkt="a" * 43)
            refresh = attrs.evolve(make_refresh("refresh-1", grant), jkt="a" * 43)
            await store.issue_tokens(access, refresh)
            assert await store.find_access_token(h("access-1"), NOW) == access
            assert await store.get_refresh_token(h("refresh-1")) == refresh
            assert await store.get_client(CLIENT) == client
            interaction = make_interaction("i1")
            interaction = attrs.evolve(interaction, request=attrs.evolve(interaction.request, dpop_jkt="j" * 43))
            await store.save_interaction(interaction)
            assert await store.get_interaction("i1", NOW) == interaction

    @pytest_twisted.ensureDeferred
    async def test_proof_is_used_once_until_it_expires(self):
        async with self.store() as store:
            assert await store.first_use(h("proof-1"), NOW + 60, NOW) is True
            assert await store.first_use(h("proof-1"), NOW + 60, NOW + 1) is False
            assert await store.first_use(h("proof-1"), NOW + 120, NOW + 59) is False
            assert await store.first_use(h("proof-2"), NOW + 60, NOW + 1) is True
            assert await store.gc(NOW + 59, 100) == 0
            assert await store.gc(NOW + 60, 100) == 2
            assert await store.first_use(h("proof-1"), NOW + 120, NOW + 60) is True
            assert await store.first_use(h("proof-1"), NOW + 180, NOW + 119) is False
            assert await store.first_use(h("proof-1"), NOW + 180, NOW + 120) is True

    @pytest_twisted.ensureDeferred
    async def test_refresh_token_round_trip(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1", scope=())
            access, refresh = await issue(store, grant, "1")
            assert access.scope == frozenset()
            assert await store.find_access_token(access.token_hash, NOW) == access
            assert await store.get_refresh_token(refresh.token_hash) == refresh
            assert await store.get_refresh_token(h("refresh-2")) is None
            assert await store.revoke_grant("g1", NOW) is True
            assert await store.get_refresh_token(refresh.token_hash) == attrs.evolve(refresh, revoked=True)

    @pytest_twisted.ensureDeferred
    async def test_rotate_refresh(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            old_access, old = await issue(store, grant, "1")
            new_refresh = make_refresh("refresh-2", grant)
            new_access = make_access("access-2", grant)
            result = await store.rotate_refresh(old.token_hash, new_refresh, new_access, b"\x00sealed", NOW + 10, NOW)
            assert result == Rotated()
            consumed = await store.get_refresh_token(old.token_hash)
            assert (consumed.consumed_at, consumed.grace_until, consumed.replay) == (NOW, NOW + 10, b"\x00sealed")
            assert consumed.revoked is False
            assert await store.get_refresh_token(new_refresh.token_hash) == new_refresh
            assert await store.find_access_token(new_access.token_hash, NOW) == new_access
            assert await store.find_access_token(old_access.token_hash, NOW) == old_access
            third = await store.rotate_refresh(
                new_refresh.token_hash, make_refresh("refresh-3", grant), make_access("access-3", grant),
                b"third", NOW + 20, NOW + 10,
            )
            assert third == Rotated()

    @pytest_twisted.ensureDeferred
    async def test_rotate_without_a_replay_leaves_none_to_replay(self):
        """No grace window: nothing is sealed, and the consumed token presented again at once is reuse."""
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            _, old = await issue(store, grant, "1")
            rotated = await store.rotate_refresh(
                old.token_hash, make_refresh("refresh-2", grant), make_access("access-2", grant), None, NOW, NOW
            )
            assert rotated == Rotated()
            assert (await store.get_refresh_token(old.token_hash)).replay is None
            again = await store.rotate_refresh(
                old.token_hash, make_refresh("refresh-x", grant), make_access("access-x", grant), None, NOW, NOW
            )
            assert again == Reused("g1")
            assert (await store.get_grant("g1")).revoked_at == NOW

    @pytest_twisted.ensureDeferred
    async def test_rotate_replay_inside_grace_window(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            _, old = await issue(store, grant, "1")
            await store.rotate_refresh(
                old.token_hash, make_refresh("refresh-2", grant), make_access("access-2", grant), b"replay", NOW + 10, NOW
            )
            for now in (NOW, NOW + 9):
                again = await store.rotate_refresh(
                    old.token_hash, make_refresh("refresh-x", grant), make_access("access-x", grant), b"other",
                    now + 10, now,
                )
                assert again == Replayed(b"replay")
            assert await store.get_refresh_token(h("refresh-x")) is None
            assert await store.find_access_token(h("access-x"), NOW) is None
            assert await store.find_access_token(h("access-2"), NOW + 9) is not None

    @pytest_twisted.ensureDeferred
    async def test_reuse_after_grace_revokes_the_family(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            other = await start_grant(store, "g2")
            access_1, old = await issue(store, grant, "1")
            other_access, _ = await issue(store, other, "other")
            await store.rotate_refresh(
                old.token_hash, make_refresh("refresh-2", grant), make_access("access-2", grant), b"replay", NOW + 10, NOW
            )
            reuse = await store.rotate_refresh(
                old.token_hash, make_refresh("refresh-x", grant), make_access("access-x", grant), b"x", NOW + 20, NOW + 10,
            )
            assert reuse == Reused("g1")
            assert (await store.get_grant("g1")).revoked_at == NOW + 10
            for token in (access_1.token_hash, h("access-2"), h("access-x")):
                assert await store.find_access_token(token, NOW + 10) is None
            assert (await store.get_refresh_token(h("refresh-2"))).revoked is True
            assert await store.get_refresh_token(h("refresh-x")) is None
            successor = await store.rotate_refresh(
                h("refresh-2"), make_refresh("refresh-3", grant), make_access("access-3", grant), b"3", NOW + 20, NOW + 10,
            )
            assert successor == RefreshNotFound()
            assert await store.find_access_token(other_access.token_hash, NOW + 10) == other_access

    @pytest_twisted.ensureDeferred
    async def test_rotate_unknown_expired_or_revoked_is_not_found(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            revoked = await start_grant(store, "g2")
            _, expiring = await issue(store, grant, "1", refresh_expires_at=NOW + 100)
            _, of_revoked = await issue(store, revoked, "2")
            await store.revoke_grant("g2", NOW)

            async def rotate(old_hash, now):
                return await store.rotate_refresh(
                    old_hash, make_refresh("refresh-new", grant), make_access("access-new", grant), b"r", now + 10, now
                )

            assert await rotate(h("refresh-unknown"), NOW) == RefreshNotFound()
            assert await rotate(expiring.token_hash, NOW + 100) == RefreshNotFound()
            assert await rotate(of_revoked.token_hash, NOW) == RefreshNotFound()
            assert await store.get_refresh_token(h("refresh-new")) is None
            assert (await store.get_refresh_token(expiring.token_hash)).consumed_at is None
            assert await rotate(expiring.token_hash, NOW + 99) == Rotated()

    @pytest_twisted.ensureDeferred
    async def test_revoke_refresh_token_revokes_grant(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            access_1, refresh = await issue(store, grant, "1")
            access_2, _ = await issue(store, grant, "2", refresh=False)
            assert await store.revoke_token(refresh.token_hash, CLIENT, NOW) == RevokedRefresh("g1")
            assert await store.find_access_token(access_1.token_hash, NOW) is None
            assert await store.find_access_token(access_2.token_hash, NOW) is None
            assert (await store.get_refresh_token(refresh.token_hash)).revoked is True
            assert (await store.get_grant("g1")).revoked_at == NOW
            assert await store.revoke_grant("g1", NOW + 1) is False

    @pytest_twisted.ensureDeferred
    async def test_revoke_access_token_revokes_only_it(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            access_1, refresh = await issue(store, grant, "1")
            access_2, _ = await issue(store, grant, "2", refresh=False)
            assert await store.revoke_token(access_1.token_hash, CLIENT, NOW) == RevokedAccess("g1")
            assert await store.revoke_token(access_1.token_hash, CLIENT, NOW + 1) == RevokedAccess("g1")
            assert await store.find_access_token(access_1.token_hash, NOW) is None
            assert await store.find_access_token(access_2.token_hash, NOW) == access_2
            assert (await store.get_refresh_token(refresh.token_hash)).revoked is False
            assert (await store.get_grant("g1")).revoked_at is None

    @pytest_twisted.ensureDeferred
    async def test_revoke_token_of_another_client_revokes_nothing(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            access, refresh = await issue(store, grant, "1")
            for token in (access.token_hash, refresh.token_hash, h("unknown")):
                assert await store.revoke_token(token, OTHER_CLIENT, NOW) == NotRevoked()
            assert await store.revoke_token(h("unknown"), CLIENT, NOW) == NotRevoked()
            assert await store.find_access_token(access.token_hash, NOW) == access
            assert await store.get_refresh_token(refresh.token_hash) == refresh

    @pytest_twisted.ensureDeferred
    async def test_revoke_grant(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            access, _ = await issue(store, grant, "1")
            assert await store.revoke_grant("g1", NOW) is True
            assert await store.revoke_grant("g1", NOW + 5) is False
            assert await store.revoke_grant("g-unknown", NOW) is False
            assert (await store.get_grant("g1")).revoked_at == NOW
            assert await store.find_access_token(access.token_hash, NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_revoke_user_grants(self):
        async with self.store() as store:
            grants = [await start_grant(store, f"g{n}") for n in range(3)]
            bobs = await start_grant(store, "g-bob", sub=BOB)
            tokens = [(await issue(store, grant, grant.grant_id))[0] for grant in grants]
            bob_access, _ = await issue(store, bobs, "bob")
            await store.revoke_grant("g0", NOW)
            assert await store.revoke_user_grants(ALICE, NOW + 1) == 2
            assert await store.revoke_user_grants(ALICE, NOW + 2) == 0
            for token in tokens:
                assert await store.find_access_token(token.token_hash, NOW + 2) is None
            assert [(await store.get_grant(g.grant_id)).revoked_at for g in grants] == [NOW, NOW + 1, NOW + 1]
            assert await store.find_access_token(bob_access.token_hash, NOW + 2) == bob_access
            assert (await store.access_state(ALICE, NOW + 2)).has_active_grant is False
            assert (await store.access_state(BOB, NOW + 2)).has_active_grant is True

    @pytest_twisted.ensureDeferred
    async def test_token_lookups_and_access_state_carry_the_ban(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            access, refresh = await issue(store, grant, "1")
            assert (await store.access_state(ALICE, NOW)) == AccessState(ban=None, has_active_grant=True)
            ban = Ban(sub=ALICE, reason="spam", created_at=NOW, until=NOW + 10)
            await store.ban_user(ban)
            assert await store.find_access_token(access.token_hash, NOW) == attrs.evolve(access, user_ban=ban)
            assert await store.get_refresh_token(refresh.token_hash) == attrs.evolve(refresh, user_ban=ban)
            assert await store.access_state(ALICE, NOW + 9) == AccessState(ban=ban, has_active_grant=True)
            assert await store.access_state(ALICE, NOW + 10) == AccessState(ban=None, has_active_grant=True)
            assert await store.access_state(BOB, NOW) == AccessState(ban=None, has_active_grant=False)
            assert ban.in_force(NOW + 9) and not ban.in_force(NOW + 10)
            await store.unban_user(ALICE)
            assert (await store.find_access_token(access.token_hash, NOW)).user_ban is None

    @pytest_twisted.ensureDeferred
    async def test_lookups_by_a_key_no_stored_text_can_hold_find_nothing(self):
        """
        A NUL or a lone surrogate (both possible in a JSON string) is in no
        stored key: a lookup by one is an unknown, never an error.
        """
        async with self.store() as store:
            for key in ("\ud800", "a\x00", "\udfff" + ALICE, "ß\ud83d"):
                assert await store.access_state(key, NOW) == AccessState(ban=None, has_active_grant=False)
                assert await store.find_access_token(key, NOW) is None
                assert await store.get_refresh_token(key) is None
                assert await store.get_ban(key, NOW) is None
                assert await store.get_client(key) is None
                assert await store.list_user_grants(key, NOW) == []

    @pytest_twisted.ensureDeferred
    async def test_lookups_made_at_once_each_get_their_own_answer(self):
        """
        Many token, code and standing lookups under way together (as a
        loaded server makes them, and a store may send them together) each
        answer as it would alone: its own token, moment, link provider and
        user.
        """
        async with self.store() as store:
            alices = await start_grant(store, "g1")
            live, live_refresh = await issue(store, alices, "live")
            brief, _ = await issue(store, alices, "brief", refresh=False, access_expires_at=NOW + 5)
            revoked, _ = await issue(store, alices, "revoked", refresh=False)
            assert await store.revoke_token(revoked.token_hash, CLIENT, NOW) is not None
            bobs = await start_grant(store, "g2", sub=BOB)
            bob_access, _ = await issue(store, bobs, "bob", refresh=False)
            ban = Ban(sub=BOB, reason="spam", created_at=NOW, until=NOW + 8)
            await store.ban_user(ban)
            await store.link_account(make_linked(provider="slack", provider_user_id="U024BE7LH"))
            tokens = [live, brief, revoked, bob_access, make_access("unknown", alices), live]
            asked = [
                (token.token_hash, now, provider)
                for now in (NOW, NOW + 5, NOW + 9) for provider in (None, "slack") for token in tokens
            ]
            states = [(sub, now) for now in (NOW, NOW + 9) for sub in (ALICE, BOB, "3f0c2a52-nobody", ALICE)]
            refreshes = [(hash_, provider) for provider in (None, "slack")
                         for hash_ in (live_refresh.token_hash, h("unknown"), live_refresh.token_hash)]
            briefs = make_grant("g3")
            await store.save_code(make_code("code-brief", briefs, expires_at=NOW + 5), briefs)
            codes = [(hash_, now, provider) for now in (NOW, NOW + 5) for provider in (None, "slack")
                     for hash_ in (h("code-g1"), h("code-brief"), h("unknown"), h("code-g1"))]
            together = await gatherResults(
                [store.find_access_token(hash_, now, link_provider=provider) for hash_, now, provider in asked]
                + [store.access_state(sub, now) for sub, now in states]
                + [store.find_code(hash_, now, link_provider=provider) for hash_, now, provider in codes]
                + [store.get_refresh_token(hash_, link_provider=provider) for hash_, provider in refreshes]
            )
            alone = [await store.find_access_token(hash_, now, link_provider=provider) for hash_, now, provider in asked]
            alone += [await store.access_state(sub, now) for sub, now in states]
            alone += [await store.find_code(hash_, now, link_provider=provider) for hash_, now, provider in codes]
            alone += [await store.get_refresh_token(hash_, link_provider=provider) for hash_, provider in refreshes]
            assert together == alone
            found_codes = dict(zip(codes, together[len(asked) + len(states):]))
            assert found_codes[h("code-g1"), NOW, None] == CodeFound(make_code("code-g1", alices), alices)
            assert found_codes[h("code-g1"), NOW + 5, "slack"].linked_user_id == "U024BE7LH"
            assert isinstance(found_codes[h("code-brief"), NOW, None], CodeFound)
            assert found_codes[h("code-brief"), NOW + 5, None] == CodeNotFound()
            assert found_codes[h("unknown"), NOW, "slack"] == CodeNotFound()
            links = [getattr(each, "linked_user_id", None) for each in together]
            assert links == [getattr(each, "linked_user_id", None) for each in alone]
            found = dict(zip(asked, together))
            assert found[live.token_hash, NOW, None] == live
            assert found[live.token_hash, NOW, None].linked_user_id is NOT_READ
            assert found[live.token_hash, NOW + 9, "slack"] == live
            assert found[live.token_hash, NOW + 9, "slack"].linked_user_id == "U024BE7LH"
            assert found[brief.token_hash, NOW, None] == brief
            assert found[brief.token_hash, NOW + 5, None] is None
            assert found[revoked.token_hash, NOW, None] is None
            assert found[bob_access.token_hash, NOW, None] == attrs.evolve(bob_access, user_ban=ban)
            assert found[h("unknown"), NOW, "slack"] is None
            assert together[-len(refreshes):] == [live_refresh, None, live_refresh] * 2
            assert [each.linked_user_id for each in together[-3:] if each] == ["U024BE7LH"] * 2
            assert together[len(asked):len(asked) + len(states)] == [
                AccessState(ban=None, has_active_grant=True), AccessState(ban=ban, has_active_grant=True),
                AccessState(ban=None, has_active_grant=False), AccessState(ban=None, has_active_grant=True),
                AccessState(ban=None, has_active_grant=True), AccessState(ban=None, has_active_grant=True),
                AccessState(ban=None, has_active_grant=False), AccessState(ban=None, has_active_grant=True),
            ]

    @pytest_twisted.ensureDeferred
    async def test_has_active_grant_follows_tokens(self):
        async with self.store() as store:
            assert (await store.access_state(ALICE, NOW)).has_active_grant is False
            grant = await start_grant(store, "g1")
            assert (await store.access_state(ALICE, NOW)).has_active_grant is False
            access, refresh = await issue(
                store, grant, "1", access_expires_at=NOW + 10, refresh_expires_at=NOW + 100
            )
            assert (await store.access_state(ALICE, NOW)).has_active_grant is True
            assert (await store.access_state(BOB, NOW)).has_active_grant is False
            assert (await store.access_state(ALICE, NOW + 10)).has_active_grant is True
            assert await store.revoke_token(access.token_hash, CLIENT, NOW) == RevokedAccess("g1")
            assert (await store.access_state(ALICE, NOW + 99)).has_active_grant is True
            assert (await store.access_state(ALICE, NOW + 100)).has_active_grant is False
            assert await store.revoke_token(refresh.token_hash, CLIENT, NOW) == RevokedRefresh("g1")
            assert (await store.access_state(ALICE, NOW)).has_active_grant is False

    @pytest_twisted.ensureDeferred
    async def test_has_active_grant_without_refresh(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            access, _ = await issue(store, grant, "1", refresh=False, access_expires_at=NOW + 10)
            assert (await store.access_state(ALICE, NOW + 9)).has_active_grant is True
            assert (await store.access_state(ALICE, NOW + 10)).has_active_grant is False
            await store.revoke_token(access.token_hash, CLIENT, NOW)
            assert (await store.access_state(ALICE, NOW)).has_active_grant is False

    @pytest_twisted.ensureDeferred
    async def test_consumed_refresh_token_is_not_an_active_grant(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            _, old = await issue(store, grant, "1", access_expires_at=NOW + 10)
            await store.rotate_refresh(
                old.token_hash,
                make_refresh("refresh-2", grant, expires_at=NOW + 50),
                make_access("access-2", grant, expires_at=NOW + 20),
                b"r", NOW + 10, NOW,
            )
            assert (await store.access_state(ALICE, NOW + 49)).has_active_grant is True
            assert (await store.access_state(ALICE, NOW + 50)).has_active_grant is False

    @pytest_twisted.ensureDeferred
    async def test_session_clients(self):
        async with self.store() as store:
            assert await store.session_clients("sid-1") == []
            await start_grant(store, "g1", client_id="zeta-app", sid="sid-1")
            await start_grant(store, "g2", client_id=CLIENT, sid="sid-1")
            await start_grant(store, "g3", client_id=CLIENT, sid="sid-1")
            await start_grant(store, "g4", client_id=OTHER_CLIENT, sid="sid-2")
            await start_grant(store, "g5", client_id=OTHER_CLIENT, sid=None)
            assert await store.session_clients("sid-1") == [CLIENT, "zeta-app"]
            assert await store.session_clients("sid-2") == [OTHER_CLIENT]
            assert await store.session_clients("sid-3") == []

    @pytest_twisted.ensureDeferred
    async def test_session_clients_include_revoked_grants(self):
        """An RP keeps its own session after its tokens are revoked: it still hears of the logout."""
        async with self.store() as store:
            await start_grant(store, "g1", client_id=CLIENT, sid="sid-1")
            await start_grant(store, "g2", client_id=OTHER_CLIENT, sid="sid-1")
            await store.revoke_grant("g1", NOW)
            await store.revoke_user_grants(ALICE, NOW)
            assert await store.session_clients("sid-1") == [CLIENT, OTHER_CLIENT]

    @pytest_twisted.ensureDeferred
    async def test_list_user_grants(self):
        async with self.store() as store:
            assert await store.list_user_grants(ALICE, NOW) == []
            late = await start_grant(store, "g-late", created_at=NOW + 5)
            early = await start_grant(store, "g-early", client_id=OTHER_CLIENT)
            ending = await start_grant(store, "g-ending", expires_at=NOW + 10)
            await start_grant(store, "g-revoked")
            await store.revoke_grant("g-revoked", NOW)
            bobs = await start_grant(store, "g-bob", sub=BOB)
            assert await store.list_user_grants(ALICE, NOW) == [early, ending, late]
            assert await store.list_user_grants(ALICE, NOW + 10) == [early, late]
            assert await store.list_user_grants(BOB, NOW) == [bobs]
            await store.revoke_user_grants(ALICE, NOW)
            assert await store.list_user_grants(ALICE, NOW) == []

    @pytest_twisted.ensureDeferred
    async def test_user_grants_are_listed_a_page_at_a_time_oldest_first(self):
        async with self.store() as store:
            grants = [await start_grant(store, grant_id, created_at=at) for grant_id, at in (
                ("g-b", NOW), ("g-a", NOW), ("g-\u00e9", NOW), ("g-B", NOW + 1), ("g-0", NOW + 2))]
            await start_grant(store, "g-bob", sub=BOB, created_at=NOW + 1)
            await start_grant(store, "g-revoked", created_at=NOW + 1)
            await store.revoke_grant("g-revoked", NOW)
            ordered = [grants[1], grants[0], grants[2], grants[3], grants[4]]
            assert await store.list_user_grants(ALICE, NOW, None, 2) == ordered[:2]
            assert await store.list_user_grants(ALICE, NOW, (NOW, "g-b"), 2) == ordered[2:4]
            assert await store.list_user_grants(ALICE, NOW, (NOW, "g-c"), 10) == ordered[2:]
            assert await store.list_user_grants(ALICE, NOW, (NOW + 1, "g-B"), 10) == ordered[4:]
            assert await store.list_user_grants(ALICE, NOW, (NOW + 2, "g-0")) == []

    @pytest_twisted.ensureDeferred
    async def test_a_page_goes_on_after_its_last_key_when_that_row_is_gone(self):
        """
        Keyset pages continue after the last key shown, not at an offset:
        removing the row a cursor ends at, or rows before it, neither
        repeats nor skips a row of the next page.
        """
        subs = [f"user-{n}" for n in range(7)]
        async with self.store() as store:
            for sub in subs:
                await store.ban_user(Ban(sub, None, NOW))
            first = await store.list_bans(NOW, None, 3)
            assert [b.sub for b in first] == subs[:3]
            for ban in first:
                assert await store.unban_user(ban.sub)
            assert [b.sub for b in await store.list_bans(NOW, first[-1].sub, 3)] == subs[3:6]

    # --- consents -----------------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_consents(self):
        async with self.store() as store:
            assert await store.get_consent(ALICE, CLIENT) is None
            assert await store.save_consent(ALICE, CLIENT, {"openid", "profile"}, NOW) == {"openid", "profile"}
            assert await store.get_consent(ALICE, CLIENT) == frozenset({"openid", "profile"})
            await store.save_consent(ALICE, OTHER_CLIENT, frozenset(), NOW)
            assert await store.get_consent(ALICE, OTHER_CLIENT) == frozenset()
            assert await store.get_consent(BOB, CLIENT) is None
            assert await store.revoke_consent(ALICE, CLIENT) is True
            assert await store.revoke_consent(ALICE, CLIENT) is False
            assert await store.get_consent(ALICE, CLIENT) is None
            assert await store.get_consent(ALICE, OTHER_CLIENT) == frozenset()

    @pytest_twisted.ensureDeferred
    async def test_no_consent_is_kept_for_a_client_removed_meanwhile(self):
        """Unless the client is one never stored (described by its metadata document)."""
        async with self.store() as store:
            assert await store.remove_client(OTHER_CLIENT) is True
            assert await store.save_consent(ALICE, OTHER_CLIENT, {"openid"}, NOW) is None
            assert await store.get_consent(ALICE, OTHER_CLIENT) is None
            unlisted = "https://app.example/client.json"
            assert await store.save_consent(ALICE, unlisted, {"openid"}, NOW, stored_client=False) == {"openid"}
            assert await store.get_consent(ALICE, unlisted) == frozenset({"openid"})

    @pytest_twisted.ensureDeferred
    async def test_a_saved_consent_adds_to_the_stored_one_and_a_revoke_ends_it(self):
        """
        The store merges (the flow never reads then writes back), so the
        scopes a revoke removed never come back with a later consent.
        """
        async with self.store() as store:
            await store.save_consent(ALICE, CLIENT, {"openid", "profile"}, NOW)
            merged = await store.save_consent(ALICE, CLIENT, frozenset({"openid", "email"}), NOW + 1)
            assert merged == {"openid", "profile", "email"}
            assert await store.get_consent(ALICE, CLIENT) == merged
            assert await store.list_user_consents(ALICE) == [Consent(ALICE, CLIENT, merged, NOW + 1)]
            assert await store.save_consent(ALICE, CLIENT, frozenset(), NOW + 2) == merged
            assert await store.revoke_consent(ALICE, CLIENT) is True
            assert await store.save_consent(ALICE, CLIENT, {"email"}, NOW + 3) == {"email"}
            assert await store.get_consent(ALICE, CLIENT) == {"email"}

    @pytest_twisted.ensureDeferred
    async def test_list_user_consents(self):
        async with self.store() as store:
            assert await store.list_user_consents(ALICE) == []
            await store.save_consent(ALICE, OTHER_CLIENT, {"openid"}, NOW)
            await store.save_consent(ALICE, CLIENT, {"openid", "profile"}, NOW + 1)
            await store.save_consent(BOB, CLIENT, {"openid"}, NOW)
            assert await store.list_user_consents(ALICE) == sorted([
                Consent(ALICE, CLIENT, {"openid", "profile"}, NOW + 1), Consent(ALICE, OTHER_CLIENT, {"openid"}, NOW),
            ], key=lambda c: c.client_id)
            await store.revoke_consent(ALICE, CLIENT)
            assert await store.list_user_consents(ALICE) == [Consent(ALICE, OTHER_CLIENT, {"openid"}, NOW)]

    # --- bans -------------------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_ban_without_until_stays(self):
        ban = Ban(ALICE, "spam", NOW)
        async with self.store() as store:
            assert await store.get_ban(ALICE, NOW) is None
            assert await store.ban_user(ban) is None
            assert await store.get_ban(ALICE, NOW) == ban
            assert await store.get_ban(ALICE, NOW + 3650 * DAY) == ban
            assert await store.get_ban(BOB, NOW) is None
            assert await store.unban_user(ALICE) is True
            assert await store.unban_user(ALICE) is False
            assert await store.get_ban(ALICE, NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_ban_with_until_ends_then(self):
        ban = Ban(ALICE, None, NOW, until=NOW + DAY)
        async with self.store() as store:
            await store.ban_user(ban)
            assert await store.get_ban(ALICE, NOW + DAY - 1) == ban
            assert await store.get_ban(ALICE, NOW + DAY) is None
            longer = Ban(ALICE, "again", NOW + 1, until=NOW + 2 * DAY)
            await store.ban_user(longer)
            assert await store.get_ban(ALICE, NOW + DAY) == longer

    @pytest_twisted.ensureDeferred
    async def test_a_ban_landing_after_the_checks_stops_the_exchange(self):
        """
        A ban stored between a code's lookup (which read no ban) and its
        redemption: the redemption issues nothing and leaves the code as it
        was, so a ban acts at once however the steps interleave; one that
        has ended stops nothing.
        """
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            assert (await store.find_code(h("code-g1"), NOW)).user_ban is None
            await store.ban_user(Ban(ALICE, "spam", NOW, until=NOW + 30))
            access, refresh = make_access("access-1", grant), make_refresh("refresh-1", grant)
            assert await store.redeem_code(h("code-g1"), access, refresh, NOW) == CodeNotFound()
            assert await store.find_access_token(access.token_hash, NOW) is None
            assert await store.get_refresh_token(refresh.token_hash) is None
            assert (await store.get_grant("g1")).revoked_at is None
            assert await store.redeem_code(h("code-g1"), access, refresh, NOW + 29) == CodeNotFound()
            assert await store.redeem_code(h("code-g1"), access, refresh, NOW + 30) == CodeRedeemed()

    @pytest_twisted.ensureDeferred
    async def test_a_ban_landing_after_the_checks_stops_the_rotation(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            _, old = await issue(store, grant, "1")
            assert (await store.get_refresh_token(old.token_hash)).user_ban is None
            await store.ban_user(Ban(ALICE, "spam", NOW))
            new_refresh, new_access = make_refresh("refresh-2", grant), make_access("access-2", grant)
            assert await store.rotate_refresh(old.token_hash, new_refresh, new_access, b"r", NOW + 10, NOW) == (
                RefreshNotFound()
            )
            assert await store.get_refresh_token(new_refresh.token_hash) is None
            assert await store.find_access_token(new_access.token_hash, NOW) is None
            assert (await store.get_refresh_token(old.token_hash)).consumed_at is None
            assert (await store.get_grant("g1")).revoked_at is None

    @pytest_twisted.ensureDeferred
    async def test_a_ban_landing_after_the_checks_stops_a_replay_too(self):
        """
        A lost answer asked for again inside the grace window is not handed
        out while the user is banned (docs/design.md, Bans: refresh refused),
        and is again once the ban is lifted; a reuse after the window still
        revokes the grant.
        """
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            _, old = await issue(store, grant, "1")
            assert await store.rotate_refresh(
                old.token_hash, make_refresh("refresh-2", grant), make_access("access-2", grant), b"replay",
                NOW + 10, NOW,
            ) == Rotated()
            await store.ban_user(Ban(ALICE, "spam", NOW))

            def again(now):
                return store.rotate_refresh(
                    old.token_hash, make_refresh("refresh-x", grant), make_access("access-x", grant), b"x",
                    now + 10, now,
                )

            assert await again(NOW + 1) == RefreshNotFound()
            assert (await store.get_grant("g1")).revoked_at is None
            assert await store.unban_user(ALICE)
            assert await again(NOW + 2) == Replayed(b"replay")
            await store.ban_user(Ban(ALICE, "spam", NOW + 3))
            assert await again(NOW + 10) == Reused("g1")
            assert await store.get_refresh_token(h("refresh-x")) is None

    @pytest_twisted.ensureDeferred
    async def test_list_bans_in_force(self):
        bans = [
            Ban("carol", "c", NOW),
            Ban(BOB, None, NOW, until=NOW + 10),
            Ban(ALICE, "a", NOW, until=NOW + 20),
        ]
        async with self.store() as store:
            assert await store.list_bans(NOW) == []
            for ban in bans:
                await store.ban_user(ban)
            assert await store.list_bans(NOW) == sorted(bans, key=lambda b: b.sub)
            assert await store.list_bans(NOW + 10) == [bans[2], bans[0]]
            assert await store.list_bans(NOW + 20) == [bans[0]]

    @pytest_twisted.ensureDeferred
    async def test_bans_in_force_are_listed_a_page_at_a_time_in_code_point_order(self):
        bans = [Ban(sub, None, NOW, until=NOW + 10 if sub == "b" else None) for sub in ("B", "a", "b", "c", "\u00e9")]
        async with self.store() as store:
            for ban in bans:
                await store.ban_user(ban)
            assert await store.list_bans(NOW, None, 2) == bans[:2]
            assert await store.list_bans(NOW, "a", 2) == bans[2:4]
            assert await store.list_bans(NOW + 10, "a", 2) == bans[3:5]
            assert await store.list_bans(NOW + 10, "aa") == bans[3:]
            assert await store.list_bans(NOW, "\u00e9", 5) == []

    # --- import -------------------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_import_batch_writes_free_keys_once(self):
        grant = make_grant("g-imported", sub=BOB)
        refresh = make_refresh("imported-refresh", grant)
        batch = ImportBatch(
            clients=[Client(CLIENT, h("secret"), ["https://app.example/cb"], first_party=True)],
            bans=[Ban(BOB, "spam", NOW, until=NOW + DAY)],
            linked=[make_linked("acct-imported", sub=BOB)],
            consents=[Consent(BOB, CLIENT, {"openid", "profile"}, NOW)],
            grants=[grant],
            refresh_tokens=[refresh],
        )
        async with self.store(clients=()) as store:
            taken = Client(OTHER_CLIENT, None, ["https://partner.example/cb"])
            await store.add_client(taken)
            counts = await store.import_batch(
                attrs.evolve(batch, clients=[*batch.clients, attrs.evolve(taken, name="not mine")])
            )
            assert counts == {kind: 1 for kind in IMPORT_KINDS}
            assert await store.get_client(OTHER_CLIENT) == taken
            assert (await store.get_client(CLIENT)).first_party
            assert await store.get_ban(BOB, NOW) == batch.bans[0]
            assert await store.get_linked_account(BOB, "discord") == batch.linked[0]
            assert await store.get_consent(BOB, CLIENT) == {"openid", "profile"}
            assert await store.get_grant(grant.grant_id) == grant
            found = await store.get_refresh_token(refresh.token_hash)
            assert (found.grant_id, found.sub, found.revoked, found.user_ban) == (
                grant.grant_id, BOB, False, batch.bans[0]
            )
            assert await store.import_batch(batch) == {kind: 0 for kind in IMPORT_KINDS}

    # --- linked accounts --------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_linked_account_round_trip_and_relink(self):
        account = make_linked()
        async with self.store() as store:
            assert await store.get_linked_account(ALICE, "discord") is None
            assert await store.link_account(account) is None
            assert await store.get_linked_account(ALICE, "discord") == account
            assert await store.get_linked_account(ALICE, "slack") is None
            assert await store.get_linked_account(BOB, "discord") is None
            refreshed = await store.update_linked_tokens("acct-1", account.version, b"new-access", b"new-refresh",
                                                         account.scope, account.expires_at, NOW)
            relinked = make_linked("acct-2", provider_user_id="999", refresh_token_enc=None, version=1)
            assert await store.link_account(relinked) == refreshed, "the link replaced, as it was when it went"
            assert await store.get_linked_account(ALICE, "discord") == relinked
            elsewhere = make_linked("acct-3", provider="slack")
            assert await store.link_account(elsewhere) is None
            assert await store.get_linked_account(ALICE, "discord") == relinked
            assert await store.unlink_account(ALICE, "discord") == relinked
            assert await store.unlink_account(ALICE, "discord") is None
            assert await store.get_linked_account(ALICE, "discord") is None
            assert await store.get_linked_account(ALICE, "slack") == elsewhere

    @pytest_twisted.ensureDeferred
    async def test_a_provider_account_links_one_user(self):
        """
        Two users linked to one chat account would share its chat_user_id:
        the second link is refused and changes nothing, the same user may
        link it again, and once its holder moves on it is free.
        """
        async with self.store() as store:
            alice = make_linked()
            assert await store.linked_sub("discord", alice.provider_user_id) is None
            await store.link_account(alice)
            assert await store.linked_sub("discord", alice.provider_user_id) == ALICE
            assert await store.linked_sub("slack", alice.provider_user_id) is None
            assert await store.linked_sub("discord", "\ud800") is None
            with pytest.raises(AlreadyLinked):
                await store.link_account(make_linked("acct-bob", sub=BOB))
            assert await store.get_linked_account(BOB, "discord") is None
            bobs = make_linked("acct-bob", sub=BOB, provider_user_id="175928847299117063")
            await store.link_account(bobs)
            with pytest.raises(AlreadyLinked):
                await store.link_account(make_linked("acct-bob-2", sub=BOB))
            assert await store.get_linked_account(BOB, "discord") == bobs
            assert await store.get_linked_account(ALICE, "discord") == alice
            again = make_linked("acct-2", updated_at=NOW + 1)
            await store.link_account(again)
            assert await store.get_linked_account(ALICE, "discord") == again
            elsewhere = make_linked("acct-bob-slack", sub=BOB, provider="slack")
            await store.link_account(elsewhere)
            assert await store.get_linked_account(BOB, "slack") == elsewhere
            await store.link_account(make_linked("acct-3", provider_user_id="999"))
            moved = make_linked("acct-bob-3", sub=BOB)
            await store.link_account(moved)
            assert await store.get_linked_account(BOB, "discord") == moved
            assert await store.linked_sub("discord", moved.provider_user_id) == BOB

    @pytest_twisted.ensureDeferred
    async def test_a_stale_link_is_displaced_only_as_it_was_read(self):
        """
        A chat account held by a user no identity backend knows any more
        goes to the next user who links it, the stale link removed in the
        same transaction, but only while it is the very link the caller read:
        one changed since (its tokens refreshed) or of another chat account
        is left, and the link refused as without it.
        """
        async with self.store() as store:
            stale = make_linked()
            await store.link_account(stale)
            bobs_earlier = make_linked("acct-bob-1", sub=BOB, provider_user_id="175928847299117063")
            await store.link_account(bobs_earlier)
            bobs = make_linked("acct-bob-2", sub=BOB)
            other = make_linked("acct-carol", sub="carol", provider_user_id="999")
            await store.link_account(other)
            with pytest.raises(AlreadyLinked):
                await store.link_account(bobs, displacing=attrs.evolve(other, provider_user_id=stale.provider_user_id))
            assert await store.get_linked_account("carol", "discord") == other
            refreshed = await store.update_linked_tokens("acct-1", stale.version, b"new-access", None, stale.scope,
                                                         stale.expires_at, NOW + 1)
            with pytest.raises(AlreadyLinked):
                await store.link_account(bobs, displacing=stale)
            assert await store.get_linked_account(ALICE, "discord") == refreshed
            assert await store.get_linked_account(BOB, "discord") == bobs_earlier
            assert await store.link_account(bobs, displacing=refreshed) == bobs_earlier
            assert await store.get_linked_account(ALICE, "discord") is None
            assert await store.get_linked_account(BOB, "discord") == bobs
            assert await store.linked_sub("discord", stale.provider_user_id) == BOB
            with pytest.raises(AlreadyLinked):
                await store.link_account(make_linked("acct-alice-2"), displacing=refreshed)
            assert await store.get_linked_account("carol", "discord") == other

    @pytest_twisted.ensureDeferred
    async def test_import_batch_skips_a_provider_account_linked_to_another_user(self):
        async with self.store() as store:
            await store.link_account(make_linked())
            batch = ImportBatch(clients=[], bans=[], linked=[make_linked("acct-imported", sub=BOB)], consents=[],
                                grants=[], refresh_tokens=[])
            assert (await store.import_batch(batch))["linked"] == 0
            assert await store.get_linked_account(BOB, "discord") is None
            assert (await store.get_linked_account(ALICE, "discord")).account_id == "acct-1"

    @pytest_twisted.ensureDeferred
    async def test_token_and_code_lookups_bring_the_link_to_the_provider_asked(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            access, refresh = await issue(store, grant, "1")

            async def links(provider):
                found = (
                    await store.find_access_token(access.token_hash, NOW, link_provider=provider),
                    await store.get_refresh_token(refresh.token_hash, link_provider=provider),
                    await store.find_code(h("code-g1"), NOW, link_provider=provider),
                )
                assert found[0] == access and found[1] == refresh and found[2].code.grant_id == "g1"
                return tuple(each.linked_user_id for each in found)

            assert await links("discord") == (None, None, None)
            await store.link_account(make_linked(sub=BOB, provider_user_id="175928847299117063"))
            await store.link_account(make_linked("acct-2", provider="slack", provider_user_id="U024BE7LH"))
            assert await links("discord") == (None, None, None)
            assert await links("slack") == ("U024BE7LH",) * 3
            assert await links(None) == (NOT_READ,) * 3
            await store.link_account(make_linked("acct-3"))
            assert await links("discord") == ("80351110224678912",) * 3
            await store.unlink_account(ALICE, "discord")
            assert await links("discord") == (None, None, None)

    @pytest_twisted.ensureDeferred
    async def test_update_linked_tokens_compare_and_swap(self):
        async with self.store() as store:
            await store.link_account(make_linked())
            updated = await store.update_linked_tokens(
                "acct-1", 1, b"new-access", b"new-refresh", "identify", NOW + 2 * DAY, NOW + 5
            )
            expected = make_linked(
                access_token_enc=b"new-access", refresh_token_enc=b"new-refresh", scope="identify",
                expires_at=NOW + 2 * DAY, updated_at=NOW + 5, version=2,
            )
            assert updated == expected
            assert await store.get_linked_account(ALICE, "discord") == expected
            stale = await store.update_linked_tokens("acct-1", 1, b"lost", None, "x", NOW, NOW + 6)
            assert stale is None
            assert await store.get_linked_account(ALICE, "discord") == expected
            assert await store.update_linked_tokens("acct-9", 1, b"a", None, "x", NOW, NOW) is None
            third = await store.update_linked_tokens("acct-1", 2, b"third", None, "identify", NOW + DAY, NOW + 7)
            assert (third.version, third.access_token_enc, third.refresh_token_enc) == (3, b"third", b"new-refresh")

    @pytest_twisted.ensureDeferred
    async def test_link_lock_lease(self):
        async with self.store() as store:
            assert await store.acquire_link_lock("acct-1", "server-a", NOW, 30) is True
            assert await store.acquire_link_lock("acct-1", "server-b", NOW + 29, 30) is False
            assert await store.acquire_link_lock("acct-2", "server-b", NOW, 30) is True
            assert await store.acquire_link_lock("acct-1", "server-a", NOW + 10, 30) is True
            assert await store.acquire_link_lock("acct-1", "server-b", NOW + 39, 30) is False
            assert await store.acquire_link_lock("acct-1", "server-b", NOW + 40, 30) is True
            assert await store.acquire_link_lock("acct-1", "server-a", NOW + 41, 30) is False

    @pytest_twisted.ensureDeferred
    async def test_release_link_lock(self):
        async with self.store() as store:
            await store.acquire_link_lock("acct-1", "server-a", NOW, 30)
            await store.release_link_lock("acct-1", "server-b")
            assert await store.acquire_link_lock("acct-1", "server-b", NOW, 30) is False
            await store.release_link_lock("acct-1", "server-a")
            assert await store.acquire_link_lock("acct-1", "server-b", NOW, 30) is True
            await store.release_link_lock("acct-unknown", "server-a")

    # --- login throttle and known devices ------------------------------------

    @staticmethod
    async def attempts(store, count, account="alice", address=HERE, now=NOW, policy=ThrottlePolicy(), device=None):
        """Make C{count} attempts that must all be allowed; fires with their tickets."""
        tickets = []
        for _ in range(count):
            decision = await store.attempt(account, address, device, policy, now)
            assert decision.allowed and decision.wait is None and decision.ticket is not None, decision
            tickets.append(decision.ticket)
        return tickets

    @pytest_twisted.ensureDeferred
    async def test_throttle_pair_delay_doubles_up_to_the_maximum(self):
        policy = ThrottlePolicy(failures_per_pair=3, max_delay=8)
        async with self.store() as store:
            tickets = await self.attempts(store, 3, policy=policy)
            assert len(set(tickets)) == 3
            timeline = [
                (NOW, 1), (NOW, 1), (NOW + 1, None),
                (NOW + 1, 2), (NOW + 2, 1), (NOW + 3, None),
                (NOW + 3, 4), (NOW + 7, None),
                (NOW + 7, 8), (NOW + 15, None),
                (NOW + 15, 8), (NOW + 22, 1), (NOW + 23, None),
            ]
            for now, wait in timeline:
                decision = await store.attempt("alice", HERE, None, policy, now)
                assert decision.wait == wait, (now - NOW, decision)
                assert (decision.ticket is None) == (wait is not None) == (not decision.allowed)
            # The same account from another address, another account from this one: not held back.
            await self.attempts(store, 3, address=THERE, now=NOW + 23, policy=policy)
            await self.attempts(store, 3, account="bob", now=NOW + 23, policy=policy)

    @pytest_twisted.ensureDeferred
    async def test_throttle_default_policy_delay(self):
        policy = ThrottlePolicy()
        async with self.store() as store:
            await self.attempts(store, 5, policy=policy)
            await store.remember_device("alice", h("device-1"), NOW + DAY)
            decision = await store.attempt("alice", HERE, h("device-1"), policy, NOW)
            assert decision == ThrottleDecision(wait=1, ticket=None)

    @pytest_twisted.ensureDeferred
    async def test_throttle_address_limit_over_all_accounts(self):
        policy = ThrottlePolicy(failures_per_address=5, window=600)
        async with self.store() as store:
            for n in range(5):
                await self.attempts(store, 1, account=f"user-{n}", now=NOW + 10 * n, policy=policy)
            await store.remember_device("user-9", h("device-1"), NOW + DAY)
            for device in (None, h("device-1")):
                decision = await store.attempt("user-9", HERE, device, policy, NOW + 50)
                assert decision == ThrottleDecision(wait=550, ticket=None)
            assert (await store.attempt("user-0", HERE, None, policy, NOW + 599)).wait == 1
            # The real user, elsewhere, is not held back.
            await self.attempts(store, 1, account="user-9", address=THERE, now=NOW + 50, policy=policy)
            # Once the oldest failure has left the window, one more may be made.
            await self.attempts(store, 1, account="user-9", now=NOW + 600, policy=policy)
            assert (await store.attempt("user-9", HERE, None, policy, NOW + 600)).wait == 10

    @pytest_twisted.ensureDeferred
    async def test_throttle_account_limit_spares_known_devices(self):
        policy = ThrottlePolicy(failures_per_account=5, window=600)
        async with self.store() as store:
            for n in range(5):
                await self.attempts(store, 1, address=f"198.51.100.{n}", now=NOW + n, policy=policy)
            decision = await store.attempt("alice", "203.0.113.9", None, policy, NOW + 100)
            assert decision == ThrottleDecision(wait=500, ticket=None)
            await store.remember_device("alice", h("device-1"), NOW + DAY)
            await self.attempts(store, 2, address="203.0.113.9", now=NOW + 100, policy=policy, device=h("device-1"))
            # Another account's device, or one not remembered, is no known device.
            await store.remember_device("bob", h("device-2"), NOW + DAY)
            for device in (h("device-2"), h("device-3")):
                assert (await store.attempt("alice", "203.0.113.9", device, policy, NOW + 100)).wait == 502
            # Known devices' attempts count too; the limit lifts as failures leave the window.
            assert (await store.attempt("alice", "203.0.113.9", None, policy, NOW + 600)).wait == 2
            await self.attempts(store, 1, account="bob", address="203.0.113.9", now=NOW + 100, policy=policy)
            await self.attempts(store, 1, address="203.0.113.9", now=NOW + 602, policy=policy)

    @pytest_twisted.ensureDeferred
    async def test_throttle_counts_any_name_alike(self):
        """The throttle knows no users: unknown names are counted exactly like known ones."""
        policy = ThrottlePolicy(failures_per_pair=2)
        names = ("alice", "no-such-user", "ßtraße", "名前", "nul\x00name", "x" * 300)
        async with self.store() as store:
            for name in names:
                await self.attempts(store, 2, account=name, policy=policy)
            for name in names:
                assert await store.attempt(name, HERE, None, policy, NOW) == ThrottleDecision(wait=1, ticket=None)

    @pytest_twisted.ensureDeferred
    async def test_forgive_uncounts_one_attempt(self):
        policy = ThrottlePolicy(failures_per_pair=3)
        async with self.store() as store:
            tickets = await self.attempts(store, 3, policy=policy)
            assert (await store.attempt("alice", HERE, None, policy, NOW)).wait == 1
            assert await store.forgive(tickets[1]) is True
            assert await store.forgive(tickets[1]) is False
            [fourth] = await self.attempts(store, 1, policy=policy)
            assert fourth not in tickets
            assert (await store.attempt("alice", HERE, None, policy, NOW)).wait == 1
            assert await store.forgive(max(tickets + [fourth]) + 1000) is False

    @pytest_twisted.ensureDeferred
    async def test_succeeded_clears_only_the_pair(self):
        policy = ThrottlePolicy(failures_per_pair=3)
        async with self.store() as store:
            cleared = await self.attempts(store, 3, policy=policy)
            for account, address in (("alice", THERE), ("bob", HERE)):
                await self.attempts(store, 3, account=account, address=address, policy=policy)
            assert await store.succeeded("alice", HERE, NOW) is None
            assert [await store.forgive(ticket) for ticket in cleared] == [False] * 3
            await self.attempts(store, 3, policy=policy)
            assert (await store.attempt("alice", HERE, None, policy, NOW)).wait == 1
            assert (await store.attempt("alice", THERE, None, policy, NOW)).wait == 1
            assert (await store.attempt("bob", HERE, None, policy, NOW)).wait == 1
            await store.succeeded("carol", HERE, NOW)

    @pytest_twisted.ensureDeferred
    async def test_counted_attempts_expire_and_gc_removes_them(self):
        policy = ThrottlePolicy(failures_per_address=3, window=600)
        async with self.store() as store:
            for account, now in (("a", NOW), ("b", NOW), ("c", NOW + 1)):
                await self.attempts(store, 1, account=account, now=now, policy=policy)
            assert (await store.attempt("d", HERE, None, policy, NOW + 599)).wait == 1
            await self.attempts(store, 1, account="d", now=NOW + 600, policy=policy)
            assert await store.gc(NOW + 600, 1) == 1
            assert await store.gc(NOW + 600, 1) == 1
            assert await store.gc(NOW + 600, 100) == 0
            assert await store.gc(NOW + 601, 100) == 1
            # Left: d's attempt, until NOW + 1200.
            await self.attempts(store, 2, account="e", now=NOW + 601, policy=policy)
            assert (await store.attempt("f", HERE, None, policy, NOW + 601)).wait == 599

    @staticmethod
    async def known(store, account, device_hash, now):
        """
        Whether the throttle takes C{device_hash} for a known device of
        C{account} at C{now}: the one attempt the account's limit allows is
        made from elsewhere first; both are forgiven after.
        """
        policy = ThrottlePolicy(failures_per_account=1, window=3 * DAY)
        first = await store.attempt(account, THERE, None, policy, now)
        decision = await store.attempt(account, HERE, device_hash, policy, now)
        for ticket in (first.ticket, decision.ticket):
            if ticket is not None:
                await store.forgive(ticket)
        return decision.allowed

    @pytest_twisted.ensureDeferred
    async def test_known_devices(self):
        async with self.store() as store:
            assert await self.known(store, "alice", h("device-1"), NOW) is False
            assert await self.known(store, "alice", None, NOW) is False
            assert await store.remember_device("alice", h("device-1"), NOW + DAY) is None
            await store.remember_device("alice", h("device-2"), NOW + HOUR)
            assert await self.known(store, "alice", h("device-1"), NOW + DAY - 1) is True
            assert await self.known(store, "alice", h("device-1"), NOW + DAY) is False
            assert await self.known(store, "bob", h("device-1"), NOW) is False
            assert await self.known(store, "alice", h("device-3"), NOW) is False
            assert await self.known(store, "alice", None, NOW) is False
            await store.remember_device("alice", h("device-1"), NOW + 2 * DAY)
            assert await self.known(store, "alice", h("device-1"), NOW + DAY) is True
            assert await store.gc(NOW + HOUR, 100) == 1
            assert await self.known(store, "alice", h("device-2"), NOW) is False
            assert await self.known(store, "alice", h("device-1"), NOW) is True
            assert await store.gc(NOW + 2 * DAY, 100) == 1
            assert await self.known(store, "alice", h("device-1"), NOW) is False

    # --- housekeeping -----------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_gc_removes_only_what_expired(self):
        async with self.store() as store:
            for n, expires_at in enumerate((NOW - 1, NOW, NOW + 1)):
                await store.create_session(BrowserSession(h(f"cookie-{n}"), f"sid-{n}", ALICE, NOW, NOW, expires_at))
                await store.save_interaction(make_interaction(f"ia-{n}", expires_at=expires_at))
                await store.save_link_attempt(make_link_attempt(f"{n}", expires_at=expires_at))
                await store.ban_user(Ban(f"user-{n}", None, NOW, until=expires_at))
            await store.ban_user(Ban("user-forever", None, NOW))
            grant = await start_grant(store, "g1")
            expired_code = make_code("code-expired", grant, expires_at=NOW)
            await store.save_code(expired_code, make_grant("g2"))
            await issue(store, grant, "old", access_expires_at=NOW, refresh_expires_at=NOW)
            live_access, live_refresh = await issue(store, grant, "live", access_expires_at=NOW + 1)
            await store.acquire_link_lock("acct-1", "server-a", NOW - 30, 30)
            await store.acquire_link_lock("acct-2", "server-a", NOW - 29, 30)

            removed = await store.gc(NOW, 100)

            assert removed == 2 + 2 + 2 + 2 + 1 + 1 + 1 + 1
            assert [await store.get_session(h(f"cookie-{n}"), NOW - 2) is not None for n in range(3)] == [
                False, False, True,
            ]
            assert [await store.get_interaction(f"ia-{n}", NOW - 2) is not None for n in range(3)] == [
                False, False, True,
            ]
            assert [await store.take_link_attempt(h(f"state-{n}"), h("cookie-1"), NOW - 2) for n in range(3)] == [
                None, None, make_link_attempt("2", expires_at=NOW + 1),
            ]
            assert await store.list_bans(NOW - 2) == [Ban("user-2", None, NOW, until=NOW + 1), Ban("user-forever", None, NOW)]
            assert await store.get_refresh_token(h("refresh-old")) is None
            assert await store.find_access_token(h("access-old"), NOW - 1) is None
            assert await store.find_access_token(live_access.token_hash, NOW) == live_access
            assert await store.get_refresh_token(live_refresh.token_hash) == live_refresh
            assert await store.find_code(h("code-expired"), NOW - 1) == CodeNotFound()
            assert await store.find_code(h("code-g1"), NOW) == CodeFound(make_code("code-g1", grant), grant)
            assert await store.get_grant("g1") == grant
            assert await store.acquire_link_lock("acct-1", "server-b", NOW, 30) is True
            assert await store.acquire_link_lock("acct-2", "server-b", NOW, 30) is False
            assert await store.gc(NOW, 100) == 0

    @pytest_twisted.ensureDeferred
    async def test_gc_works_in_batches(self):
        async with self.store() as store:
            for n in range(5):
                await store.create_session(BrowserSession(h(f"cookie-{n}"), f"sid-{n}", ALICE, NOW, NOW, NOW))
            assert await store.gc(NOW, 2) == 2
            assert await store.gc(NOW, 2) == 2
            assert await store.gc(NOW, 2) == 1
            assert await store.gc(NOW, 2) == 0

    @pytest_twisted.ensureDeferred
    async def test_gc_erases_replays_after_grace(self):
        async with self.store() as store:
            grant = await start_grant(store, "g1")
            _, old = await issue(store, grant, "1")
            await store.rotate_refresh(
                old.token_hash, make_refresh("refresh-2", grant), make_access("access-2", grant), b"sealed", NOW + 10, NOW
            )
            await store.gc(NOW + 9, 100)
            assert (await store.get_refresh_token(old.token_hash)).replay == b"sealed"
            await store.gc(NOW + 10, 100)
            consumed = await store.get_refresh_token(old.token_hash)
            assert (consumed.replay, consumed.consumed_at) == (None, NOW)
            assert await store.get_refresh_token(h("refresh-2")) is not None

    @pytest_twisted.ensureDeferred
    async def test_gc_drops_dead_grants_only(self):
        async with self.store() as store:
            revoked = await start_grant(store, "revoked")
            revoked_access, _ = await issue(store, revoked, "revoked")
            await store.revoke_grant("revoked", NOW)
            expired_with_live_token = await start_grant(store, "expired-live", expires_at=NOW)
            await issue(store, expired_with_live_token, "expired-live", refresh=False)
            expired_idle = await start_grant(store, "expired-idle", expires_at=NOW)
            await issue(store, expired_idle, "expired-idle", access_expires_at=NOW, refresh_expires_at=NOW)
            live = await start_grant(store, "live")
            await issue(store, live, "live")

            # Their codes could still be redeemed until NOW + 60: every grant stays.
            await store.gc(NOW, 100)
            for grant in (revoked, expired_with_live_token, expired_idle, live):
                assert (await store.get_grant(grant.grant_id)) is not None, grant.grant_id

            await store.gc(NOW + 60, 100)
            assert await store.get_grant("revoked") is None
            assert await store.get_grant("expired-idle") is None
            assert await store.get_grant("live") == live
            assert (await store.get_grant("expired-live")) == expired_with_live_token
            assert await store.find_access_token(revoked_access.token_hash, NOW) is None
            assert await store.get_refresh_token(h("refresh-revoked")) is None

            await store.gc(NOW + HOUR, 100)
            assert await store.get_grant("expired-live") is None
            assert await store.get_grant("live") == live


class StoreConcurrencyConformance(FactorConcurrencyConformance, DeviceConcurrencyConformance):
    """
    Races between two servers sharing one database: each atomic step must
    have exactly one winner. See the module docstring for C{make_store_pair}.
    """

    rounds = 10
    removal_rounds = 200
    """Rounds of a removal against a redemption or rotation: on PostgreSQL they deadlocked within a few hundred."""

    def make_store_pair(self):
        raise NotImplementedError("a concurrency test class defines make_store_pair()")

    @asynccontextmanager
    async def store_pair(self):
        first, second = await maybeDeferred(self.make_store_pair)
        try:
            await add_clients(first, GRANT_CLIENTS)
            yield first, second
        finally:
            await gatherResults([first.close(), second.close()])

    @pytest_twisted.ensureDeferred
    async def test_racing_code_redemptions(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                grant = await start_grant(first, f"g{n}")
                tokens = [make_access(f"access-{n}-{side}", grant) for side in (1, 2)]
                results = await gatherResults([
                    store.redeem_code(h(f"code-g{n}"), access, make_refresh(f"refresh-{n}-{side}", grant), NOW)
                    for side, store, access in ((1, first, tokens[0]), (2, second, tokens[1]))
                ])
                assert sorted(type(r).__name__ for r in results) == ["CodeRedeemed", "CodeReused"]
                assert CodeReused(grant.grant_id) in results
                # The loser revoked the grant: the winner's tokens are dead too.
                assert (await first.get_grant(grant.grant_id)).revoked_at == NOW
                for access in tokens:
                    assert await second.find_access_token(access.token_hash, NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_a_code_redeemed_by_many_at_once_issues_once_then_nothing(self):
        """Four redemptions of one code, two on each server: one wins, and the reuse revokes what it issued."""
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                grant = await start_grant(first, f"g{n}")
                tokens = [make_access(f"access-{n}-{k}", grant) for k in range(4)]
                results = await gatherResults([
                    (first, second)[k % 2].redeem_code(h(f"code-g{n}"), access, None, NOW)
                    for k, access in enumerate(tokens)
                ])
                assert sorted(type(r).__name__ for r in results) == ["CodeRedeemed"] + ["CodeReused"] * 3
                assert (await second.get_grant(grant.grant_id)).revoked_at == NOW
                for access in tokens:
                    assert await first.find_access_token(access.token_hash, NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_a_revocation_racing_a_rotation_leaves_no_live_successor(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                grant = await start_grant(first, f"g{n}")
                _, old = await issue(first, grant, f"{n}")
                successor, access = make_refresh(f"refresh-{n}-next", grant), make_access(f"access-{n}-next", grant)
                revoked, _ = await gatherResults([
                    first.revoke_token(old.token_hash, CLIENT, NOW),
                    second.rotate_refresh(old.token_hash, successor, access, b"r", NOW + 10, NOW),
                ])
                assert revoked == RevokedRefresh(grant.grant_id)
                assert (await second.get_grant(grant.grant_id)).revoked_at == NOW
                assert await first.find_access_token(access.token_hash, NOW) is None
                found = await second.get_refresh_token(successor.token_hash)
                assert found is None or found.revoked is True
                assert await first.rotate_refresh(
                    successor.token_hash, make_refresh(f"refresh-{n}-3", grant), make_access(f"access-{n}-3", grant),
                    b"3", NOW + 10, NOW,
                ) == RefreshNotFound()

    @pytest_twisted.ensureDeferred
    async def test_a_client_removed_while_its_code_is_redeemed_keeps_no_token(self):
        async with self.store_pair() as (first, second):
            for n in range(self.removal_rounds):
                client_id = f"leaving-{n}"
                grant = await start_grant(first, f"g{n}", client_id=client_id)
                access, refresh = make_access(f"access-{n}", grant), make_refresh(f"refresh-{n}", grant)
                removed, redeemed = await gatherResults([
                    first.remove_client(client_id),
                    second.redeem_code(h(f"code-g{n}"), access, refresh, NOW),
                ])
                assert removed is True
                assert redeemed in (CodeRedeemed(), CodeNotFound())
                assert await first.find_access_token(access.token_hash, NOW) is None
                assert await second.get_refresh_token(refresh.token_hash) is None
                assert await second.get_grant(grant.grant_id) is None

    @pytest_twisted.ensureDeferred
    async def test_a_client_removed_while_its_refresh_token_rotates_keeps_no_token(self):
        async with self.store_pair() as (first, second):
            for n in range(self.removal_rounds):
                client_id = f"leaving-{n}"
                grant = await start_grant(first, f"g{n}", client_id=client_id)
                _, old = await issue(first, grant, f"{n}")
                successor, access = make_refresh(f"refresh-{n}-next", grant), make_access(f"access-{n}-next", grant)
                removed, rotated = await gatherResults([
                    first.remove_client(client_id),
                    second.rotate_refresh(old.token_hash, successor, access, b"r", NOW + 10, NOW),
                ])
                assert removed is True
                assert rotated in (Rotated(), RefreshNotFound())
                assert await first.find_access_token(access.token_hash, NOW) is None
                assert await second.get_refresh_token(successor.token_hash) is None
                assert await second.get_refresh_token(old.token_hash) is None

    @pytest_twisted.ensureDeferred
    async def test_a_client_removed_while_a_consent_is_saved_keeps_none(self):
        async with self.store_pair() as (first, second):
            for n in range(self.removal_rounds):
                client_id = f"leaving-{n}"
                await add_clients(first, (client_id,))
                removed, saved = await gatherResults([
                    first.remove_client(client_id), second.save_consent(ALICE, client_id, {"openid"}, NOW),
                ])
                assert removed is True and saved in (None, {"openid"})
                assert await second.get_consent(ALICE, client_id) is None

    @pytest_twisted.ensureDeferred
    async def test_a_client_removed_while_its_user_grants_are_revoked(self):
        """Both end several grants at once, each locking them in its own order."""
        async with self.store_pair() as (first, second):
            for n in range(self.removal_rounds):
                client_id, sub = f"leaving-{n}", f"user-{n}"
                grants = [await start_grant(first, f"g{n}-{k}", sub=sub, client_id=client_id) for k in range(4)]
                grants += [await start_grant(first, f"g{n}-other", sub=sub)]
                removed, revoked = await gatherResults([
                    first.remove_client(client_id), second.revoke_user_grants(sub, NOW),
                ])
                assert removed is True and 1 <= revoked <= 5
                assert [await second.get_grant(g.grant_id) for g in grants[:4]] == [None] * 4
                assert (await second.get_grant(grants[4].grant_id)).revoked_at == NOW

    @pytest_twisted.ensureDeferred
    async def test_once_a_ban_beside_an_exchange_answers_nothing_more_is_issued(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                sub = f"banned-{n}"
                grant, later = await start_grant(first, f"g{n}", sub=sub), await start_grant(first, f"g{n}-2", sub=sub)
                refresh = make_refresh(f"refresh-{n}", grant)
                _, redeemed = await gatherResults([
                    first.ban_user(Ban(sub, "spam", NOW)),
                    second.redeem_code(h(f"code-g{n}"), make_access(f"access-{n}", grant), refresh, NOW),
                ])
                assert redeemed in (CodeRedeemed(), CodeNotFound())
                assert await second.redeem_code(h(f"code-g{n}-2"), make_access(f"access-{n}-2", later), None, NOW) == (
                    CodeNotFound()
                )
                assert await second.rotate_refresh(
                    refresh.token_hash, make_refresh(f"refresh-{n}-3", grant), make_access(f"access-{n}-3", grant),
                    b"3", NOW + 10, NOW,
                ) == RefreshNotFound()

    @pytest_twisted.ensureDeferred
    async def test_racing_links_of_one_user_keep_one(self):
        """Two link callbacks of one user at once, with two chat accounts: the user keeps one link."""
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                sub = f"linker-{n}"
                await gatherResults([
                    store.link_account(make_linked(f"acct-{n}-{side}", sub=sub, provider_user_id=f"chat-{n}-{side}"))
                    for side, store in (("a", first), ("b", second))
                ])
                kept = await second.get_linked_account(sub, "discord")
                other = "b" if kept.provider_user_id == f"chat-{n}-a" else "a"
                assert kept.provider_user_id in (f"chat-{n}-a", f"chat-{n}-b")
                assert await first.linked_sub("discord", kept.provider_user_id) == sub
                assert await first.linked_sub("discord", f"chat-{n}-{other}") is None

    @pytest_twisted.ensureDeferred
    async def test_racing_displacements_of_one_stale_link_keep_one(self):
        """Two users taking one stale link at once, on two servers: one links the chat account, the other is refused."""
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                stale = make_linked(f"acct-{n}-stale", sub=f"gone-{n}", provider_user_id=f"chat-{n}")
                await first.link_account(stale)
                results = await gatherResults([
                    store.link_account(make_linked(f"acct-{n}-{side}", sub=f"taker-{n}-{side}",
                                                   provider_user_id=f"chat-{n}"), displacing=stale)
                    .addErrback(lambda failure: failure.trap(AlreadyLinked))
                    for side, store in (("a", first), ("b", second))
                ])
                assert sorted(results, key=lambda result: result is AlreadyLinked) == [None, AlreadyLinked]
                taker = await second.linked_sub("discord", f"chat-{n}")
                assert taker in (f"taker-{n}-a", f"taker-{n}-b")
                assert await first.get_linked_account(f"gone-{n}", "discord") is None

    @pytest_twisted.ensureDeferred
    async def test_racing_consents_add_up_and_never_undo_a_revoke(self):
        """
        Consents saved at once by two servers both count, and a revoke
        racing a save leaves either nothing or only the scopes of that save.
        """
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                sub = f"racer-{n}"
                await gatherResults([first.save_consent(sub, CLIENT, {"openid", "profile"}, NOW),
                                     second.save_consent(sub, CLIENT, {"openid", "email"}, NOW)])
                assert await first.get_consent(sub, CLIENT) == {"openid", "profile", "email"}
                await gatherResults([first.revoke_consent(sub, CLIENT),
                                     second.save_consent(sub, CLIENT, {"address"}, NOW + 1)])
                assert await second.get_consent(sub, CLIENT) in (None, {"address"})

    @pytest_twisted.ensureDeferred
    async def test_racing_links_of_one_provider_account(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                chat_user = f"chat-user-{n}"
                outcomes = await gatherResults([
                    ensureDeferred(_link_outcome(store, make_linked(f"acct-{n}-{sub}", sub=sub,
                                                                    provider_user_id=chat_user)))
                    for store, sub in ((first, ALICE), (second, BOB))
                ])
                assert sorted(outcomes) == [False, True]
                winner = ALICE if outcomes[0] else BOB
                loser = BOB if outcomes[0] else ALICE
                assert (await second.get_linked_account(winner, "discord")).provider_user_id == chat_user
                found = await first.get_linked_account(loser, "discord")
                assert found is None or found.provider_user_id != chat_user

    @pytest_twisted.ensureDeferred
    async def test_racing_assertion_jti_claims(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                claims = await gatherResults(
                    [store.claim_jti(CLIENT, f"jti-{n}", NOW + 60, NOW) for store in (first, second)]
                )
                assert sorted(claims) == [False, True]

    @pytest_twisted.ensureDeferred
    async def test_racing_proof_uses(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                results = await gatherResults(
                    [store.first_use(h(f"proof-{n}"), NOW + 60, NOW) for store in (first, second, second, first)]
                )
                assert sorted(results) == [False, False, False, True]

    @pytest_twisted.ensureDeferred
    async def test_racing_server_keys(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                keys = await gatherResults(
                    [store.server_key(f"key-{n}") for store in (first, second, second, first)]
                )
                assert len(set(keys)) == 1 and len(keys[0]) == 32
                assert await second.server_key(f"key-{n}") == keys[0]

    @pytest_twisted.ensureDeferred
    async def test_racing_client_secret_rotations_keep_both_secrets(self):
        """
        Two operators rotating one client's secret at once, on two servers,
        without If-Match: each change is a compare-and-set of the record it
        read (change_client), so the later rotation keeps the earlier one's
        secret as its previous one; neither handed-out secret is lost.
        """
        async with self.store_pair() as (first, second):
            ops = [ClientOperations(store=store, clock=Clock(), declared=frozenset(), resolve=None)
                   for store in (first, second)]
            key = await first.server_key(CLIENT_SECRET_KEY)
            for n in range(self.rounds):
                client, original = await ops[0].create(
                    {"client_id": f"rotated-{n}", "redirect_uris": ["https://rp.example/cb"]}, actor="test")
                rotations = await gatherResults([
                    ensureDeferred(each.rotate_secret(client.client_id, actor="test")) for each in ops
                ])
                stored = await second.get_client(client.client_id)
                assert stored in [rotated for rotated, _ in rotations]
                assert {stored.secret_hash, stored.previous_secret_hash} == {
                    client_secret_hash(secret, key) for _, secret in rotations
                }
                assert client_secret_hash(original, key) not in (stored.secret_hash, stored.previous_secret_hash)

    @pytest_twisted.ensureDeferred
    async def test_racing_refresh_rotations(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                grant = await start_grant(first, f"g{n}")
                _, old = await issue(first, grant, f"{n}")
                results = await gatherResults(
                    [
                        store.rotate_refresh(
                            old.token_hash,
                            make_refresh(f"refresh-{n}-{side}", grant),
                            make_access(f"access-{n}-{side}", grant),
                            side.encode(),
                            NOW + 10,
                            NOW,
                        )
                        for side, store in (("a", first), ("b", second))
                    ]
                )
                winner = "a" if results[0] == Rotated() else "b"
                loser = "b" if winner == "a" else "a"
                assert results == ([Rotated(), Replayed(b"a")] if winner == "a" else [Replayed(b"b"), Rotated()])
                assert await second.get_refresh_token(h(f"refresh-{n}-{winner}")) is not None
                assert await second.get_refresh_token(h(f"refresh-{n}-{loser}")) is None
                assert await first.find_access_token(h(f"access-{n}-{loser}"), NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_racing_interaction_takes(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                await first.save_interaction(make_interaction(f"ia-{n}", CONSENT_STAGE))
                results = await gatherResults(
                    [store.take_interaction(f"ia-{n}", CONSENT_STAGE) for store in (first, second)]
                )
                assert sorted(results) == [False, True]

    @pytest_twisted.ensureDeferred
    async def test_racing_login_interactions_never_pass_the_cap(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                address = f"198.51.100.{n}"
                results = await gatherResults(
                    [
                        (first, second)[k % 2].save_login_interaction(
                            make_interaction(f"ia-{n}-{k}", address=address), 5
                        )
                        for k in range(12)
                    ]
                )
                assert sorted(results, key=lambda r: r is not None) == [None] * 5 + [NOW + 600] * 7
                kept = [k for k in range(12) if await second.get_interaction(f"ia-{n}-{k}", NOW) is not None]
                assert kept == [k for k, result in enumerate(results) if result is None]

    @pytest_twisted.ensureDeferred
    async def test_racing_link_attempt_takes(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                attempt = make_link_attempt(f"{n}")
                await first.save_link_attempt(attempt)
                results = await gatherResults(
                    [store.take_link_attempt(attempt.state_hash, attempt.session_hash, NOW) for store in (first, second)]
                )
                assert sorted(results, key=lambda r: r is None) == [attempt, None]

    @pytest_twisted.ensureDeferred
    async def test_racing_pushed_request_takes(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                pushed = make_pushed(f"{n}")
                await first.save_pushed_request(pushed)
                results = await gatherResults(
                    [store.take_pushed_request(pushed.uri_hash, CLIENT, NOW) for store in (first, second)]
                )
                assert sorted(results, key=lambda r: r is None) == [pushed, None]

    @pytest_twisted.ensureDeferred
    async def test_racing_link_locks(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                results = await gatherResults(
                    [
                        store.acquire_link_lock(f"acct-{n}", holder, NOW, 30)
                        for holder, store in (("server-a", first), ("server-b", second))
                    ]
                )
                assert sorted(results) == [False, True]

    @pytest_twisted.ensureDeferred
    async def test_racing_linked_token_updates(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                await first.link_account(make_linked(f"acct-{n}", sub=f"user-{n}", provider_user_id=f"chat-user-{n}"))
                results = await gatherResults(
                    [
                        store.update_linked_tokens(f"acct-{n}", 1, side, side, "identify", NOW + DAY, NOW)
                        for side, store in ((b"a", first), (b"b", second))
                    ]
                )
                updated = [r for r in results if r is not None]
                assert len(updated) == 1 and updated[0].version == 2
                assert await second.get_linked_account(f"user-{n}", "discord") == updated[0]

    async def race_attempts(self, policy, account_of, address_of, racers=12) -> None:
        """Attempts C{n} of C{racers}, made at once on both servers, let exactly five through."""
        async with self.store_pair() as (first, second):
            results = await gatherResults(
                [
                    (first, second)[n % 2].attempt(account_of(n), address_of(n), None, policy, NOW)
                    for n in range(racers)
                ]
            )
        allowed = [result.ticket for result in results if result.allowed]
        assert len(allowed) == len(set(allowed)) == 5, results
        assert all(result.wait > 0 and result.ticket is None for result in results if not result.allowed)

    @pytest_twisted.ensureDeferred
    async def test_racing_login_attempts_of_one_pair(self):
        await self.race_attempts(ThrottlePolicy(failures_per_pair=5), lambda n: "alice", lambda n: HERE)

    @pytest_twisted.ensureDeferred
    async def test_racing_login_attempts_from_one_address(self):
        await self.race_attempts(ThrottlePolicy(failures_per_address=5), lambda n: f"user-{n}", lambda n: HERE)

    @pytest_twisted.ensureDeferred
    async def test_racing_login_attempts_on_one_account(self):
        await self.race_attempts(
            ThrottlePolicy(failures_per_account=5), lambda n: "alice", lambda n: f"198.51.100.{n}"
        )
