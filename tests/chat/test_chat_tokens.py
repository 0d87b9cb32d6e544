"""
Fresh chat-platform tokens: served as stored while fresh, refreshed once
under the store's lease when expiring (however many callers, on however many
instances), saved by compare-and-swap, never lost when the provider rotates
the refresh token, and left untouched when the provider is down or refuses.
Also the [chat] config section and the encryption at rest.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import pytest_twisted
from attrs import evolve
from twisted.internet import reactor
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock, deferLater
from twisted.logger import formatEvent

from authsrv.chat.config import DEFAULT_SCOPES, ChatConfig, chat_config
from authsrv.chat.crypto import ACCESS, REFRESH, TokenCipher, UndecryptableToken, key_from_text, new_key_text
from authsrv.chat.errors import ChatNotLinked, ChatProviderUnavailable, ChatRefreshRefused
from authsrv.chat.provider import MAX_EXPIRES_IN, ChatProvider
from authsrv.chat.tokens import ChatTokens, ProviderToken
from authsrv.configsection import Problems, Section
from authsrv.context import PluginContext
from authsrv.flows.claims import ClaimsSource
from authsrv.records import NOT_READ, LinkedAccount, User
from authsrv.store import postgres as pg_store, sqlite
from authsrv.testing.fake_chat import FakeChatProvider, FakeChatUser

NOW = 1_800_000_000
ALICE = User(sub="alice-sub", login="alice", chat_user_id="from-the-backend")
ACCOUNT = "acct-alice"
HOUR = 3600


class Identity:
    def __init__(self, *users):
        self.users = {u.sub: u for u in users}

    def user_by_id(self, sub):
        return succeed(self.users.get(sub))


@asynccontextmanager
async def sqlite_store(path: Path):
    """A store over a database file, with its own thread (one "instance")."""
    context = PluginContext(reactor, path.parent)
    store = sqlite.from_config(Section({"path": str(path)}, "store", path.parent), context)
    try:
        yield store
    finally:
        await store.close()
        context.stop()


class World:
    """One fake provider, a cipher, and ChatTokens objects built on demand."""

    def __init__(self, tmp_path: Path):
        self.clock = Clock()
        self.clock.advance(NOW)
        self.path = tmp_path / "authsrv.sqlite3"
        self.fake = FakeChatProvider(self.clock, expires_in=2 * HOUR)
        self.config = ChatConfig(
            encryption_key=key_from_text(new_key_text()), client_secret=self.fake.client_secret,
            **self.fake.endpoints("https://chat.example.test"),
        )
        self.cipher = TokenCipher(self.config.encryption_key)
        self.identity = Identity(ALICE)

    def tokens(self, store, provider=True, config=None, wire=None) -> ChatTokens:
        """ChatTokens on C{store}; its provider reaches the fake through C{wire} when given."""
        config = config or self.config
        chat = ChatProvider(self.clock, wire or self.fake.memory_client(), config) if provider else None
        return ChatTokens(self.clock, store, self.identity, chat, self.cipher, config)

    async def link(self, store, expires_in: int) -> tuple[LinkedAccount, dict]:
        """Alice's link holding a fresh grant of the fake, expiring in C{expires_in} seconds."""
        grant = self.fake.grant()
        account = LinkedAccount(
            account_id=ACCOUNT, sub=ALICE.sub, provider="discord", provider_user_id=self.fake.user.id,
            access_token_enc=self.cipher.encrypt(grant["access_token"], ACCOUNT, ACCESS),
            refresh_token_enc=self.cipher.encrypt(grant["refresh_token"], ACCOUNT, REFRESH),
            scope=grant["scope"], expires_at=NOW + expires_in, updated_at=NOW,
        )
        await store.link_account(account)
        return account, grant

    async def settle(self, deferreds):
        """
        Run calls to completion: the store answers on real threads, the
        waiting callers poll on the clock, so both are moved along.
        """
        results: list = [None] * len(deferreds)
        done = [False] * len(deferreds)
        for index, d in enumerate(deferreds):
            d.addBoth(lambda r, i=index: (results.__setitem__(i, r), done.__setitem__(i, True)))
        for _ in range(5000):
            if all(done):
                return results
            await deferLater(reactor, 0.001, lambda: None)
            self.clock.advance(0.05)
        raise AssertionError("calls did not finish")

    async def call(self, tokens: ChatTokens, sub=ALICE.sub):
        [result] = await self.settle([Deferred.fromCoroutine(tokens.fresh_token(sub, int(self.clock.seconds())))])
        if hasattr(result, "raiseException"):
            result.raiseException()
        return result


@pytest.fixture
def world(tmp_path):
    return World(tmp_path)


def assert_no_token_logged(seen, *tokens):
    text = "\n".join(f"{formatEvent(e)} {sorted(map(str, e.values()))}" for e in seen)
    for token in tokens:
        assert token not in text


# --- fresh tokens ---------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_fresh_token_is_returned_as_stored(world, audit):
    async with sqlite_store(world.path) as store:
        account, grant = await world.link(store, HOUR)
        token = await world.call(world.tokens(store))
        assert token == ProviderToken(ACCOUNT, grant["access_token"], "identify guilds.join", NOW + HOUR)
        assert grant["access_token"] not in repr(token)
        assert world.fake.refreshes == 0
        assert await store.get_linked_account(ALICE.sub, "discord") == account
        assert audit.of("chat.refreshed") == []


@pytest_twisted.ensureDeferred
async def test_expiring_token_is_refreshed_and_saved_with_the_rotated_refresh_token(world, audit):
    async with sqlite_store(world.path) as store:
        account, grant = await world.link(store, 299)
        token = await world.call(world.tokens(store))

        assert world.fake.refreshes == 1
        assert token.access_token != grant["access_token"] and world.fake.access_valid(token.access_token)
        assert token.expires_at == NOW + 2 * HOUR
        saved = await store.get_linked_account(ALICE.sub, "discord")
        assert (saved.version, saved.expires_at, saved.updated_at) == (2, NOW + 2 * HOUR, NOW)
        assert world.cipher.decrypt(saved.access_token_enc, ACCOUNT, ACCESS) == token.access_token
        new_refresh = world.cipher.decrypt(saved.refresh_token_enc, ACCOUNT, REFRESH)
        assert new_refresh != grant["refresh_token"]
        [event] = audit.of("chat.refreshed")
        assert (event["account_id"], event["rotated"]) == (ACCOUNT, True)
        assert_no_token_logged(audit, token.access_token, new_refresh, grant["refresh_token"])

        # The saved (rotated) refresh token is the one that works next time.
        world.clock.advance(2 * HOUR)
        again = await world.call(world.tokens(store))
        assert world.fake.refreshes == 2 and world.fake.access_valid(again.access_token)
        assert (await store.get_linked_account(ALICE.sub, "discord")).version == 3


@pytest_twisted.ensureDeferred
async def test_refresh_without_rotation_keeps_the_stored_refresh_token(world, audit):
    world.fake.rotate_refresh = False
    async with sqlite_store(world.path) as store:
        account, grant = await world.link(store, 60)
        token = await world.call(world.tokens(store))
        saved = await store.get_linked_account(ALICE.sub, "discord")
        assert saved.version == 2
        assert saved.refresh_token_enc == account.refresh_token_enc
        assert world.cipher.decrypt(saved.access_token_enc, ACCOUNT, ACCESS) == token.access_token
        assert audit.of("chat.refreshed")[0]["rotated"] is False


@pytest_twisted.ensureDeferred
async def test_expired_token_is_refreshed_too(world):
    async with sqlite_store(world.path) as store:
        await world.link(store, -10)
        token = await world.call(world.tokens(store))
        assert token.expires_at > NOW and world.fake.refreshes == 1


@pytest_twisted.ensureDeferred
async def test_ten_concurrent_callers_cause_one_refresh(world):
    async with sqlite_store(world.path) as store:
        await world.link(store, 100)
        tokens = world.tokens(store)
        calls = [Deferred.fromCoroutine(tokens.fresh_token(ALICE.sub, NOW)) for _ in range(10)]
        results = await world.settle(calls)

        assert world.fake.refreshes == 1
        assert all(isinstance(r, ProviderToken) for r in results), results
        assert len({r.access_token for r in results}) == 1
        assert world.fake.access_valid(results[0].access_token)
        assert (await store.get_linked_account(ALICE.sub, "discord")).version == 2
        assert await store.acquire_link_lock(ACCOUNT, "someone-else", NOW, 30) is True


@pytest_twisted.ensureDeferred
async def test_two_instances_on_one_database_cause_one_refresh(world):
    async with sqlite_store(world.path) as first, sqlite_store(world.path) as second:
        await world.link(first, 100)
        instances = [world.tokens(first), world.tokens(second)]
        calls = [
            Deferred.fromCoroutine(instances[n % 2].fresh_token(ALICE.sub, NOW)) for n in range(8)
        ]
        results = await world.settle(calls)

        assert world.fake.refreshes == 1
        assert all(isinstance(r, ProviderToken) for r in results), results
        assert len({r.access_token for r in results}) == 1
        assert (await second.get_linked_account(ALICE.sub, "discord")).version == 2


@asynccontextmanager
async def postgres_store(dsn: str):
    """A store on the tests' PostgreSQL with its own connections and threads (one "instance")."""
    context = PluginContext(reactor, Path("."))
    store = pg_store.from_config(Section({"dsn": dsn}, "store", "."), context)
    try:
        yield store
    finally:
        await store.close()
        context.stop()


@pytest_twisted.ensureDeferred
async def test_two_instances_on_one_postgresql_refresh_once_and_keep_the_rotated_token(world, postgres):
    """
    Concurrent callers on two servers sharing a PostgreSQL store, the
    platform rotating refresh tokens (so a second refresh with the used one
    would be refused, and a save of one refresh over another would lose the
    link): one refresh, every caller gets its token, and the stored refresh
    token is the one the platform honours, round after round.
    """
    dsn = postgres.database()
    pg_store.migrate(dsn, 5, 0)
    async with postgres_store(dsn) as first, postgres_store(dsn) as second:
        await world.link(first, 100)
        instances = [world.tokens(first), world.tokens(second)]
        for done in (1, 2, 3):
            now = int(world.clock.seconds())
            calls = [Deferred.fromCoroutine(instances[n % 2].fresh_token(ALICE.sub, now)) for n in range(8)]
            results = await world.settle(calls)
            assert all(isinstance(r, ProviderToken) for r in results), results
            assert len({r.access_token for r in results}) == 1 and world.fake.access_valid(results[0].access_token)
            assert world.fake.refreshes == done
            saved = await second.get_linked_account(ALICE.sub, "discord")
            assert saved.version == done + 1
            assert world.cipher.decrypt(saved.refresh_token_enc, ACCOUNT, REFRESH) in world.fake.tokens()
            world.clock.advance(2 * HOUR)


class LateLease:
    """A store whose lease requests wait until C{go} fires: a caller that is slow to the lock."""

    def __init__(self, store):
        self._store = store
        self.go = Deferred()

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def acquire_link_lock(self, *args):
        await self.go
        return await self._store.acquire_link_lock(*args)


@pytest_twisted.ensureDeferred
async def test_a_caller_that_read_before_another_refreshed_does_not_refresh_again(world):
    async with sqlite_store(world.path) as store:
        await world.link(store, 100)
        late = LateLease(store)
        slow_caller = Deferred.fromCoroutine(world.tokens(late).fresh_token(ALICE.sub, NOW))
        first = await world.call(world.tokens(store))
        assert world.fake.refreshes == 1
        late.go.callback(None)
        [second] = await world.settle([slow_caller])
        assert world.fake.refreshes == 1
        assert second == first


@pytest_twisted.ensureDeferred
async def test_a_stuck_lease_delays_but_does_not_block(world):
    async with sqlite_store(world.path) as store:
        await world.link(store, 100)
        assert await store.acquire_link_lock(ACCOUNT, "crashed-instance", NOW, world.config.lock_ttl)
        token = await world.call(world.tokens(store))
        assert world.fake.refreshes == 1 and world.fake.access_valid(token.access_token)
        assert world.clock.seconds() >= NOW + world.config.lock_ttl


class AnswersOnTheWay:
    """
    The provider's HTTP client with every answer held back until
    C{deliver()}: the provider has done the work (rotated the refresh
    token), and its answer is still on the wire.
    """

    def __init__(self, http):
        self._http = http
        self.held: list[tuple[Deferred, object]] = []

    def request(self, *args, **kwargs):
        answered = self._http.request(*args, **kwargs)
        later: Deferred = Deferred()
        answered.addBoth(lambda result: self.held.append((later, result)))
        return later

    def deliver(self):
        held, self.held = self.held, []
        for later, result in held:
            if not later.called:
                later.callback(result)


@pytest_twisted.ensureDeferred
async def test_a_caller_that_goes_away_mid_refresh_does_not_lose_the_rotated_refresh_token(world):
    """
    The first-party service gave up (its HTTP client timed out, and the
    endpoint's work is cancelled) after the provider had rotated the
    refresh token: the refresh still ends with the new tokens saved, so
    the link keeps working, rather than keeping a refresh token the
    provider no longer honours.
    """
    async with sqlite_store(world.path) as store:
        _, grant = await world.link(store, 100)
        wire = AnswersOnTheWay(world.fake.memory_client())
        tokens = world.tokens(store, wire=wire)
        caller = Deferred.fromCoroutine(tokens.fresh_token(ALICE.sub, NOW))
        caller.addErrback(lambda _: None)
        for _ in range(2000):
            if wire.held:
                break
            await deferLater(reactor, 0.001, lambda: None)
        assert world.fake.refreshes == 1 and grant["refresh_token"] not in world.fake.tokens()
        caller.cancel()
        wire.deliver()
        for _ in range(2000):
            saved = await store.get_linked_account(ALICE.sub, "discord")
            if saved.version == 2:
                break
            await deferLater(reactor, 0.001, lambda: None)
        assert saved.version == 2
        assert world.fake.access_valid(world.cipher.decrypt(saved.access_token_enc, ACCOUNT, ACCESS))
        assert world.cipher.decrypt(saved.refresh_token_enc, ACCOUNT, REFRESH) in world.fake.tokens()
        for _ in range(2000):  # the lease is released in a store call of its own, after the save
            if released := await store.acquire_link_lock(ACCOUNT, "another-instance", NOW, 30):
                break
            await deferLater(reactor, 0.001, lambda: None)
        assert released, "the lease was not released"
        await store.release_link_lock(ACCOUNT, "another-instance")

        world.clock.advance(2 * HOUR)
        again = await world.call(world.tokens(store))
        assert world.fake.refreshes == 2 and world.fake.access_valid(again.access_token)


class RequestsOnTheWay:
    """The provider's HTTP client with every request held back until C{deliver()}: it has not reached the provider."""

    def __init__(self, http):
        self._http = http
        self.held: list[tuple[Deferred, tuple, dict]] = []

    def request(self, *args, **kwargs):
        later: Deferred = Deferred()
        self.held.append((later, args, kwargs))
        return later

    def deliver(self):
        held, self.held = self.held, []
        for later, args, kwargs in held:
            self._http.request(*args, **kwargs).chainDeferred(later)


async def until_held(wire) -> None:
    for _ in range(2000):
        if wire.held:
            return
        await deferLater(reactor, 0.001, lambda: None)
    raise AssertionError("the refresh never reached the wire")


async def relink(world, store, change: str) -> None:
    """While a refresh is on the wire: Alice unlinks, or links the same or another chat account again."""
    if change == "unlinked":
        assert await store.unlink_account(ALICE.sub, "discord") is not None
        return
    user = world.fake.user if change == "the same account" else FakeChatUser("41771983423143937", "alice-alt")
    grant = world.fake.grant(user=user)
    await store.link_account(LinkedAccount(
        account_id="acct-again", sub=ALICE.sub, provider="discord", provider_user_id=user.id,
        access_token_enc=world.cipher.encrypt(grant["access_token"], "acct-again", ACCESS),
        refresh_token_enc=world.cipher.encrypt(grant["refresh_token"], "acct-again", REFRESH),
        scope=grant["scope"], expires_at=NOW + HOUR, updated_at=NOW,
    ))


@pytest.mark.parametrize("change", ["unlinked", "another account", "the same account"])
@pytest_twisted.ensureDeferred
async def test_tokens_a_refresh_gets_for_a_link_that_went_meanwhile_are_revoked(world, change):
    """
    Unlinking takes no lease: the platform rotated the tokens, the user
    unlinked (or linked another chat account) before the answer was saved,
    and revoking the tokens the unlink removed does not reach the new ones.
    They are revoked, so the service keeps no grant the user ended; those of
    a chat account that is still linked are left (revoking them may end its
    whole grant at the platform).
    """
    async with sqlite_store(world.path) as store:
        await world.link(store, 100)
        wire = AnswersOnTheWay(world.fake.memory_client())
        tokens = world.tokens(store, wire=wire)
        before = set(world.fake.tokens())
        caller = Deferred.fromCoroutine(tokens.fresh_token(ALICE.sub, NOW))
        await until_held(wire)
        refreshed = set(world.fake.tokens()) - before
        assert world.fake.refreshes == 1 and len(refreshed) == 2
        await relink(world, store, change)
        wire.deliver()
        [result] = await world.settle([caller])
        if change == "unlinked":
            assert isinstance(result.value, ChatNotLinked), result
        else:
            assert isinstance(result, ProviderToken) and world.fake.access_valid(result.access_token)
        for _ in range(2000):
            wire.deliver()
            if len(world.fake.revocations) >= 2 or change == "the same account":
                break
            await deferLater(reactor, 0.001, lambda: None)
        honoured = refreshed & set(world.fake.tokens())
        assert honoured == (refreshed if change == "the same account" else set()), change


@pytest.mark.parametrize("change", ["unlinked", "another account"])
@pytest_twisted.ensureDeferred
async def test_a_refresh_refused_because_the_user_unlinked_or_linked_again(world, audit, change):
    """
    The unlink's (or the new link's) revocation of the old tokens reached
    the platform before the refresh did: the user has no link, not a broken
    one, or has the new one.
    """
    async with sqlite_store(world.path) as store:
        _, grant = await world.link(store, 100)
        wire = RequestsOnTheWay(world.fake.memory_client())
        tokens = world.tokens(store, wire=wire)
        caller = Deferred.fromCoroutine(tokens.fresh_token(ALICE.sub, NOW))
        await until_held(wire)
        await relink(world, store, change)
        await ChatProvider(world.clock, world.fake.memory_client(), world.config).revoke(
            grant["refresh_token"], "refresh_token")
        wire.deliver()
        [result] = await world.settle([caller])
        assert audit.of("chat.refresh_failed")[0]["reason"] == "chat_refresh_refused"
        if change == "unlinked":
            assert isinstance(getattr(result, "value", None), ChatNotLinked), result
        else:
            assert isinstance(result, ProviderToken) and result.account_id == "acct-again"
            assert world.fake.access_valid(result.access_token)


@pytest.mark.parametrize("switch", ["down", "unavailable"])
@pytest_twisted.ensureDeferred
async def test_provider_down_leaves_the_record_untouched(world, audit, switch):
    async with sqlite_store(world.path) as store:
        account, _ = await world.link(store, 100)
        tokens = world.tokens(store)
        setattr(world.fake, switch, True)
        with pytest.raises(ChatProviderUnavailable):
            await world.call(tokens)
        assert await store.get_linked_account(ALICE.sub, "discord") == account
        [event] = audit.of("chat.refresh_failed")
        assert event["reason"] == "chat_provider_unavailable"

        now = int(world.clock.seconds())
        assert await store.acquire_link_lock(ACCOUNT, "another-instance", now, 30), "the lease was not released"
        await store.release_link_lock(ACCOUNT, "another-instance")

        setattr(world.fake, switch, False)
        token = await world.call(tokens)
        assert world.fake.access_valid(token.access_token)


@pytest_twisted.ensureDeferred
async def test_refused_refresh_leaves_the_record_untouched(world, audit):
    async with sqlite_store(world.path) as store:
        account, _ = await world.link(store, 100)
        world.fake.refuse_refresh = True
        with pytest.raises(ChatRefreshRefused):
            await world.call(world.tokens(store))
        assert await store.get_linked_account(ALICE.sub, "discord") == account
        assert audit.of("chat.refresh_failed")[0]["reason"] == "chat_refresh_refused"


@pytest_twisted.ensureDeferred
async def test_a_link_without_refresh_token_must_be_linked_again(world):
    async with sqlite_store(world.path) as store:
        account, _ = await world.link(store, 100)
        await store.link_account(evolve(account, refresh_token_enc=None))
        with pytest.raises(ChatRefreshRefused):
            await world.call(world.tokens(store))
        assert world.fake.refreshes == 0


@pytest_twisted.ensureDeferred
async def test_not_linked_or_unknown_user(world):
    async with sqlite_store(world.path) as store:
        with pytest.raises(ChatNotLinked):
            await world.call(world.tokens(store))
        await world.link(store, HOUR)
        world.identity.users.clear()
        with pytest.raises(ChatNotLinked):
            await world.call(world.tokens(store))


@pytest_twisted.ensureDeferred
async def test_without_a_provider_fresh_links_are_still_served(world):
    async with sqlite_store(world.path) as store:
        _, grant = await world.link(store, HOUR)
        tokens = world.tokens(store, provider=False)
        assert (await world.call(tokens)).access_token == grant["access_token"]
        world.clock.advance(HOUR - 200)
        with pytest.raises(ChatProviderUnavailable):
            await world.call(tokens)


@pytest_twisted.ensureDeferred
async def test_without_a_chat_section(world):
    async with sqlite_store(world.path) as store:
        tokens = ChatTokens(world.clock, store, world.identity, None, None, None)
        with pytest.raises(ChatNotLinked):
            await world.call(tokens)
        await world.link(store, HOUR)
        with pytest.raises(ChatProviderUnavailable):
            await world.call(tokens)


@pytest_twisted.ensureDeferred
async def test_a_token_sealed_with_another_key_is_not_served(world):
    async with sqlite_store(world.path) as store:
        await world.link(store, HOUR)
        world.cipher = TokenCipher(key_from_text(new_key_text()))
        with pytest.raises(ChatNotLinked):
            await world.call(world.tokens(store))


@pytest_twisted.ensureDeferred
async def test_raw_store_bytes_hold_no_token(world):
    async with sqlite_store(world.path) as store:
        _, grant = await world.link(store, 100)
        token = await world.call(world.tokens(store))
        saved = await store.get_linked_account(ALICE.sub, "discord")
        refresh = world.cipher.decrypt(saved.refresh_token_enc, ACCOUNT, REFRESH)
    raw = b"".join(p.read_bytes() for p in world.path.parent.glob(world.path.name + "*"))
    assert saved.provider_user_id.encode() in raw
    for secret in (grant["access_token"], grant["refresh_token"], token.access_token, refresh):
        assert secret.encode() not in raw


async def chat_user_id(store, user: User, link=NOT_READ) -> str | None:
    return (await ClaimsSource(store, "discord").user(user, link)).chat_user_id


@pytest_twisted.ensureDeferred
async def test_chat_user_id_prefers_the_stored_link(world):
    async with sqlite_store(world.path) as store:
        assert await chat_user_id(store, ALICE) == "from-the-backend"
        assert await chat_user_id(store, User(sub="nobody", login="n")) is None
        await world.link(store, HOUR)
        assert await chat_user_id(store, ALICE) == world.fake.user.id
        assert await chat_user_id(store, ALICE, None) == "from-the-backend"
        assert await chat_user_id(store, ALICE, "read-with-the-token") == "read-with-the-token"
        assert (await ClaimsSource(store, None).user(ALICE)).chat_user_id == "from-the-backend"


# --- encryption at rest -----------------------------------------------------------


def test_cipher_binds_account_and_kind():
    cipher = TokenCipher(key_from_text(new_key_text()))
    sealed = cipher.encrypt("the-token", "acct-1", ACCESS)
    assert b"the-token" not in sealed
    assert cipher.encrypt("the-token", "acct-1", ACCESS) != sealed
    assert cipher.decrypt(sealed, "acct-1", ACCESS) == "the-token"
    for account, kind in (("acct-2", ACCESS), ("acct-1", REFRESH)):
        with pytest.raises(UndecryptableToken):
            cipher.decrypt(sealed, account, kind)
    with pytest.raises(UndecryptableToken):
        cipher.decrypt(sealed[:-1] + bytes([sealed[-1] ^ 1]), "acct-1", ACCESS)
    with pytest.raises(UndecryptableToken):
        cipher.decrypt(b"\x02" + sealed[1:], "acct-1", ACCESS)
    with pytest.raises(UndecryptableToken):
        TokenCipher(key_from_text(new_key_text())).decrypt(sealed, "acct-1", ACCESS)


@pytest.mark.parametrize("text, problem", [
    ("c2hvcnQ", "must be 32 bytes encoded as base64url, not 5 bytes"),
    ("!!!!", "must be base64url text"),
])
def test_key_text_errors(text, problem):
    with pytest.raises(ValueError, match=problem):
        key_from_text(text)


# --- config ---------------------------------------------------------------------


def section(data: dict, tmp_path: Path = Path(".")) -> Section:
    return Section(data, "chat", tmp_path)


def read_chat(data: dict, tmp_path: Path = Path(".")) -> tuple[ChatConfig | None, list[str]]:
    """C{[chat]} as C{data} gives it, and each mistake found in it."""
    checked = Problems()
    config = chat_config(section(data, tmp_path), checked)
    return config, [str(e) for e in checked.errors]


def chat_config_of(data: dict, tmp_path: Path = Path(".")) -> ChatConfig:
    config, errors = read_chat(data, tmp_path)
    assert errors == []
    return config


def test_config_defaults(monkeypatch):
    key = new_key_text()
    monkeypatch.setenv("CHAT_KEY", key)
    monkeypatch.setenv("CHAT_SECRET", "s3cret")
    config = chat_config_of({"client_id": "123", "client_secret_env": "CHAT_SECRET",
                             "encryption_key_env": "CHAT_KEY"})
    assert config == ChatConfig(
        encryption_key=key_from_text(key), provider="discord", client_id="123", client_secret="s3cret",
        authorize_url="https://discord.com/oauth2/authorize", token_url="https://discord.com/api/oauth2/token",
        user_url="https://discord.com/api/users/@me", scopes=DEFAULT_SCOPES, pkce=True,
        refresh_margin=300, timeout=10, lock_ttl=30,
    )
    assert config.can_link
    assert config.revocation_url == "https://discord.com/api/oauth2/token/revoke"
    assert "s3cret" not in repr(config) and key not in repr(config)
    assert chat_config(None, Problems()) is None


def test_config_everything_and_secrets_from_files(tmp_path):
    (tmp_path / "key").write_text(new_key_text() + "\n")
    (tmp_path / "secret").write_text("from-a-file\n")
    config = chat_config_of({
        "provider": "fakechat", "client_id": "abc", "client_secret_file": "secret", "encryption_key_file": "key",
        "authorize_url": "http://127.0.0.1:9/authorize", "token_url": "http://localhost:9/token",
        "user_url": "https://chat.example/me", "scopes": ["identify"], "pkce": False,
        "refresh_margin": "1m", "timeout": "5s", "lock_ttl": 20,
    }, tmp_path)
    assert (config.provider, config.client_secret) == ("fakechat", "from-a-file")
    assert (config.scopes, config.pkce) == (("identify",), False)
    assert (config.refresh_margin, config.timeout, config.lock_ttl) == (60, 5, 20)
    assert config.authorize_url == "http://127.0.0.1:9/authorize"
    assert config.revocation_url is None, "Discord's revocation endpoint is no default for another provider"
    revoking = chat_config_of({
        "encryption_key_file": "key", "token_url": "http://localhost:9/token",
        "revocation_url": "http://localhost:9/revoke",
    }, tmp_path)
    assert revoking.revocation_url == "http://localhost:9/revoke"


def test_config_without_client_serves_stored_links_only(monkeypatch):
    monkeypatch.setenv("CHAT_KEY", new_key_text())
    config = chat_config_of({"encryption_key_env": "CHAT_KEY"})
    assert (config.client_id, config.client_secret, config.can_link) == (None, None, False)


@pytest.mark.parametrize("extra, message", [
    ({}, "chat.encryption_key_env: is required (or encryption_key_file)"),
    ({"encryption_key": "x"}, "chat.encryption_key: secrets are not written in the config file"),
    ({"encryption_key_env": "SHORT_KEY"},
     "chat.encryption_key_env: must be 32 bytes encoded as base64url, not 16 bytes"),
    ({"encryption_key_env": "CHAT_KEY", "client_id": "1"}, "chat.client_secret_env: is required"),
    ({"encryption_key_env": "CHAT_KEY", "client_secret_env": "CHAT_KEY"}, "chat.client_id: is required when"),
    ({"encryption_key_env": "CHAT_KEY", "token_url": "http://chat.example/token"}, "chat.token_url: must use https"),
    ({"encryption_key_env": "CHAT_KEY", "user_url": "ftp://x/me"}, "chat.user_url: 'ftp://x/me' must be an absolute"),
    ({"encryption_key_env": "CHAT_KEY", "revocation_url": "http://chat.example/r"},
     "chat.revocation_url: must use https"),
    ({"encryption_key_env": "CHAT_KEY", "scopes": "identify guilds.join"}, "chat.scopes: each scope is one word"),
    ({"encryption_key_env": "CHAT_KEY", "pkce": "yes"}, "chat.pkce: must be true or false"),
    ({"encryption_key_env": "CHAT_KEY", "timeout": 0}, "chat.timeout: must be longer than zero"),
    ({"encryption_key_env": "CHAT_KEY", "timeout": "40s"}, "chat.lock_ttl: must be longer than timeout (40s)"),
    ({"encryption_key_env": "CHAT_KEY", "refresh_margin": "soon"}, "chat.refresh_margin: must be a duration"),
    ({"encryption_key_env": "CHAT_KEY", "secret": "x"}, "chat.secret: unknown key"),
])
def test_config_errors(monkeypatch, extra, message):
    monkeypatch.setenv("CHAT_KEY", new_key_text())
    monkeypatch.setenv("SHORT_KEY", "A" * 22)
    _, errors = read_chat(extra)
    assert errors[0].startswith(message), errors


def test_a_key_file_that_holds_no_key_is_named_by_its_own_key(tmp_path):
    """The operator wrote encryption_key_file: the line names that key, not a key absent from the file."""
    (tmp_path / "chat.key").write_text("not a key\n")
    _, errors = read_chat({"encryption_key_file": "chat.key"}, tmp_path)
    assert errors == ["chat.encryption_key_file: must be base64url text"]


@pytest.mark.parametrize("expires_in", [300_000_000_000, 10**20])
@pytest_twisted.ensureDeferred
async def test_a_lifetime_of_centuries_is_taken_as_a_year_and_the_rotated_refresh_token_kept(world, expires_in):
    """Such an expires_in once overflowed SQLite's integer, or a date, after the provider had rotated."""
    async with sqlite_store(world.path) as store:
        _, grant = await world.link(store, 299)
        world.fake.expires_in = expires_in
        token = await world.call(world.tokens(store))
        assert token.expires_at == NOW + MAX_EXPIRES_IN
        saved = await store.get_linked_account(ALICE.sub, "discord")
        assert saved.expires_at == NOW + MAX_EXPIRES_IN
        assert world.cipher.decrypt(saved.refresh_token_enc, ACCOUNT, REFRESH) != grant["refresh_token"]
