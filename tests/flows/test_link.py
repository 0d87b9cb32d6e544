"""
Linking a chat account through the service's pages, in memory: the real web
app over a real store, the fake provider reached through its in-memory
client. A signed-in browser is a session created in the store and its
cookie; every bad input is a page, never a 500.
"""

from __future__ import annotations

import html
import re

import pytest
import pytest_twisted
from attrs import evolve
from treq.testing import StubTreq
from twisted.internet.defer import fail, succeed
from twisted.logger import formatEvent

from flow_client import Browser, location
from harness import ISSUER, SPOOF, Harness, query_of
from web.test_admin_api import AUTH as ADMIN_AUTH, Admin

from authsrv.chat.config import ChatConfig
from authsrv.chat.crypto import ACCESS, REFRESH, TokenCipher, key_from_text, new_key_text
from authsrv.chat.provider import ChatProvider
from authsrv.chat.tokens import ChatTokens
from authsrv.flows.link import ChatLinking, unlink_token
from authsrv.identity.errors import BackendUnavailable
from authsrv.protocol import pkce
from authsrv.records import Ban, BrowserSession
from authsrv.testing.fake_chat import FakeChatProvider, FakeChatUser
from authsrv.testing.identity import ALICE, BOB, MALLORY, PASSWORDS
from authsrv.tokens import new_token, token_hash
from authsrv.service import admin_operations, backchannel_notifier, web_root

LINK = "/api/auth/link/chat"
CALLBACK = ISSUER + "/link/chat/callback"
CHAT = "https://chat.example.test"


class LinkWorld:
    """The harness's server with chat linking wired in, and the fake provider."""

    def __init__(self, harness: Harness, *, pkce_enabled=True, linking=True):
        self.h = harness
        self.fake = FakeChatProvider(harness.clock)
        self.config = ChatConfig(
            encryption_key=key_from_text(new_key_text()), client_secret=self.fake.client_secret,
            pkce=pkce_enabled, **self.fake.endpoints(CHAT),
        )
        self.cipher = TokenCipher(self.config.encryption_key)
        self.provider = ChatProvider(harness.clock, self.fake.memory_client(), self.config)
        self.linking = linking_flow = ChatLinking(
            store=harness.store, identity=harness.identity, provider=self.provider, cipher=self.cipher,
            issuer=ISSUER, pkce_enabled=pkce_enabled,
        ) if linking else None
        harness.root = web_root(
            harness.config, harness.clock, harness.store, harness.keystore, harness.identity, lambda: None,
            chat_link=linking_flow, hash_password=harness.hash_password,
        )
        harness.http = StubTreq(harness.root)
        self.provider_browser = self.fake.memory_client()

    async def sign_in(self, sub=ALICE.sub, ttl=3600) -> str:
        cookie = new_token()
        now = self.h.now()
        await self.h.store.create_session(BrowserSession(token_hash(cookie), new_token(16), sub, now, now, now + ttl))
        return cookie

    async def get(self, path, cookie=None):
        return await self.h.get(path, headers=session_header(cookie))

    async def start(self, cookie) -> str:
        """The link page's button; returns the provider authorize URL it redirects to."""
        response, body = await self.get(LINK, cookie)
        assert_page(response, body, 200, "Link your discord account")
        response, body = await self.h.post(LINK, {"csrf": csrf_of(body)}, headers=session_header(cookie))
        assert response.code == 303, body
        return response.headers.getRawHeaders(b"location")[0].decode()

    async def approve(self, authorize_url: str) -> str:
        """The provider's side: the browser follows the authorize URL and is sent back."""
        response = await self.provider_browser.get(authorize_url, allow_redirects=False)
        assert response.code == 302
        return response.headers.getRawHeaders(b"location")[0].decode()

    async def callback(self, url: str, cookie):
        assert url.startswith(CALLBACK)
        return await self.get(url[len("http://127.0.0.1:8080"):], cookie)


@pytest_twisted.async_yield_fixture
async def world(tmp_path, monkeypatch):
    harness = await Harness(tmp_path, monkeypatch).start()
    yield LinkWorld(harness)
    await harness.close()


def session_header(cookie) -> dict:
    """The browser's cookie, sent as a header so that no cookie jar carries it to the next request."""
    return {"cookie": f"authsrv_session={cookie}"} if cookie else {}


def assert_unlinked(response, done: str) -> None:
    """An unlink answers by sending the browser to the account page, which says what it did."""
    assert response.code == 303 and location(response) == f"{ISSUER}/account?done={done}"


def assert_page(response, body, status, words):
    assert response.code == status, body
    assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/html")
    assert response.headers.getRawHeaders(b"x-frame-options") == [b"DENY"]
    assert words.encode() in body, body


def csrf_of(body: bytes) -> str:
    return html.unescape(re.search(rb'name="csrf" value="([^"]*)"', body).group(1).decode())


@pytest_twisted.ensureDeferred
async def test_link_end_to_end(world):
    cookie = await world.sign_in()
    authorize_url = await world.start(cookie)

    assert authorize_url.startswith(CHAT + "/oauth2/authorize?")
    query = query_of(authorize_url)
    assert {k: query[k] for k in ("response_type", "client_id", "redirect_uri", "scope", "code_challenge_method")} == {
        "response_type": "code", "client_id": world.fake.client_id, "redirect_uri": CALLBACK,
        "scope": "identify guilds.join", "code_challenge_method": "S256",
    }
    session_hash = token_hash(cookie)
    attempt = await world.h.store.take_link_attempt(token_hash(query["state"]), session_hash, world.h.now())
    assert attempt.sub == ALICE.sub and attempt.session_hash == session_hash
    assert pkce.s256(attempt.code_verifier) == query["code_challenge"]
    await world.h.store.save_link_attempt(attempt)

    response, body = await world.callback(await world.approve(authorize_url), cookie)
    assert_page(response, body, 200, "Chat account linked")
    assert world.fake.user.id.encode() in body
    assert world.fake.exchanges == 1

    link = await world.h.store.get_linked_account(ALICE.sub, "discord")
    assert (link.provider_user_id, link.scope, link.version) == (world.fake.user.id, "identify guilds.join", 1)
    assert link.expires_at == world.h.now() + world.fake.expires_in
    access = world.cipher.decrypt(link.access_token_enc, link.account_id, ACCESS)
    assert world.fake.access_valid(access)
    assert world.cipher.decrypt(link.refresh_token_enc, link.account_id, REFRESH)
    assert await world.h.store.take_link_attempt(token_hash(query["state"]), token_hash(cookie), world.h.now()) is None

    tokens = ChatTokens(world.h.clock, world.h.store, world.h.identity, world.provider, world.cipher, world.config)
    served = await tokens.fresh_token(ALICE.sub, world.h.now())
    assert (served.account_id, served.access_token) == (link.account_id, access)

    # Linking again replaces the earlier link.
    response, _ = await world.callback(await world.approve(await world.start(cookie)), cookie)
    assert response.code == 200
    relinked = await world.h.store.get_linked_account(ALICE.sub, "discord")
    assert relinked.account_id != link.account_id


@pytest_twisted.ensureDeferred
async def test_only_the_start_pages_button_starts_a_link(world):
    """
    Starting was a GET, so another site's page (a link, an image, a
    redirect) could start a link in a signed-in browser and have it come
    back linked to a chat account of the attacker's: the GET is a page whose
    button posts with a CSRF token bound to the session, and whose
    form-action lets the redirect to the provider through.
    """
    cookie = await world.sign_in()
    response, body = await world.get(LINK, cookie)
    assert_page(response, body, 200, "Link your discord account")
    assert response.headers.getRawHeaders(b"location") is None
    assert f"form-action 'self' {CHAT}".encode() in response.headers.getRawHeaders(b"content-security-policy")[0]
    for fields in ({}, {"csrf": "forged"}, {"csrf": csrf_of(body) + "x"}):
        response, body = await world.h.post(LINK, fields, headers=session_header(cookie))
        assert_page(response, body, 403, "This form has expired")
        assert response.headers.getRawHeaders(b"location") is None
    other = await world.sign_in()
    response, body = await world.h.post(LINK, {"csrf": unlink_token(cookie)}, headers=session_header(cookie))
    assert_page(response, body, 403, "This form has expired")
    response, body = await world.h.post(LINK, {"csrf": csrf_of((await world.get(LINK, cookie))[1])},
                                        headers=session_header(other))
    assert_page(response, body, 403, "This form has expired")
    response, body = await world.h.post(LINK, {"csrf": "x"})
    assert_page(response, body, 401, "Sign in at the application first")
    assert world.fake.exchanges == 0 and await world.h.store.get_linked_account(ALICE.sub, "discord") is None
    assert (await world.callback(await world.approve(await world.start(cookie)), cookie))[0].code == 200


@pytest_twisted.ensureDeferred
async def test_linking_another_chat_account_revokes_the_replaced_links_tokens(world, audit):
    """
    Linking another chat account left the replaced link's tokens valid at
    the platform, where the service still showed as connected to it: they
    are revoked as at unlinking, those the store replaced. Linking the same
    chat account again leaves them: revoking them may end the platform's
    whole grant (RFC 7009 section 2.1), the new tokens' with it.
    """
    cookie = await world.sign_in()

    async def link() -> tuple[str, str]:
        response, body = await world.callback(await world.approve(await world.start(cookie)), cookie)
        assert_page(response, body, 200, "Chat account linked")
        linked = await world.h.store.get_linked_account(ALICE.sub, "discord")
        return (world.cipher.decrypt(linked.access_token_enc, linked.account_id, ACCESS),
                world.cipher.decrypt(linked.refresh_token_enc, linked.account_id, REFRESH))

    await link()
    access, refresh = await link()
    assert world.fake.revocations == []
    world.fake.user = FakeChatUser("175928847299117063", "another")
    new_access, _ = await link()
    assert world.fake.revocations == [(access, "access_token"), (refresh, "refresh_token")]
    assert not world.fake.access_valid(access) and world.fake.access_valid(new_access)
    assert [e["provider_user_id"] for e in audit.of("chat.linked")][-1] == "175928847299117063"


@pytest_twisted.ensureDeferred
async def test_a_chat_account_linked_to_another_user_is_refused(world):
    """
    Two users whose chat_user_id names one chat account would confuse every
    service that maps chat users to users: the second link is a page saying
    what to do, and its tokens are not kept.
    """
    alice = await world.sign_in()
    response, _ = await world.callback(await world.approve(await world.start(alice)), alice)
    assert response.code == 200
    alices = await world.h.store.get_linked_account(ALICE.sub, "discord")

    bob = await world.sign_in(BOB.sub)
    response, body = await world.callback(await world.approve(await world.start(bob)), bob)
    assert_page(response, body, 409, "already linked to another account. Unlink it there first")
    assert world.fake.exchanges == 2
    assert await world.h.store.get_linked_account(BOB.sub, "discord") is None
    assert await world.h.store.get_linked_account(ALICE.sub, "discord") == alices
    assert revoked_once_each(world)
    assert world.fake.access_valid(world.cipher.decrypt(alices.access_token_enc, alices.account_id, ACCESS))

    # Its holder may link it again; once they unlink, it is free for the other user.
    response, _ = await world.callback(await world.approve(await world.start(alice)), alice)
    assert response.code == 200
    assert (await world.h.store.get_linked_account(ALICE.sub, "discord")).account_id != alices.account_id
    assert await world.h.store.unlink_account(ALICE.sub, "discord")
    response, body = await world.callback(await world.approve(await world.start(bob)), bob)
    assert_page(response, body, 200, "Chat account linked")
    assert (await world.h.store.get_linked_account(BOB.sub, "discord")).provider_user_id == world.fake.user.id


async def link_alice_then_remove_her(world) -> tuple:
    """Alice's link, her tokens, and her removed from the users file directly, not through the admin API."""
    alice = await world.sign_in()
    response, _ = await world.callback(await world.approve(await world.start(alice)), alice)
    assert response.code == 200
    alices = await world.h.store.get_linked_account(ALICE.sub, "discord")
    tokens = (world.cipher.decrypt(alices.access_token_enc, alices.account_id, ACCESS),
              world.cipher.decrypt(alices.refresh_token_enc, alices.account_id, REFRESH))
    await world.h.identity.remove_user(ALICE.login)
    assert await world.h.identity.user_by_id(ALICE.sub) is None
    return alices, tokens


@pytest_twisted.ensureDeferred
async def test_a_chat_account_whose_holder_no_backend_knows_links_again(world, audit):
    """
    A user removed from the identity backend directly (the users file
    edited, an LDAP entry or a PostgreSQL row deleted) kept their link, and
    the chat account was refused to everyone for ever, the same person's new
    account too: the stale link is replaced, its tokens revoked at the
    platform as a replaced link's are, and the audit log says so.
    """
    alices, (access, refresh) = await link_alice_then_remove_her(world)
    bob = await world.sign_in(BOB.sub)
    response, body = await world.callback(await world.approve(await world.start(bob)), bob)
    assert_page(response, body, 200, "Chat account linked")
    bobs = await world.h.store.get_linked_account(BOB.sub, "discord")
    assert bobs.provider_user_id == alices.provider_user_id
    assert await world.h.store.get_linked_account(ALICE.sub, "discord") is None
    assert await world.h.store.linked_sub("discord", alices.provider_user_id) == BOB.sub
    assert world.fake.revocations == [(access, "access_token"), (refresh, "refresh_token")]
    assert world.fake.access_valid(world.cipher.decrypt(bobs.access_token_enc, bobs.account_id, ACCESS))
    [replaced] = audit.of("chat.stale_link_replaced")
    assert (replaced["sub"], replaced["former_sub"], replaced["provider_user_id"], replaced["account_id"]) == (
        BOB.sub, ALICE.sub, alices.provider_user_id, alices.account_id)
    assert [e["sub"] for e in audit.of("chat.linked")] == [ALICE.sub, BOB.sub]
    assert not audit.of("chat.link_refused")


@pytest_twisted.ensureDeferred
async def test_a_holder_the_backend_cannot_answer_for_keeps_the_link(world, monkeypatch, audit):
    """An identity backend that is down says nothing of the holder: the link stays and the chat account is refused."""
    alices, (access, _) = await link_alice_then_remove_her(world)
    bob = await world.sign_in(BOB.sub)
    monkeypatch.setattr(world.h.identity, "user_by_id", lambda sub: succeed(BOB) if sub == BOB.sub else fail(
        BackendUnavailable("directory down")))
    response, body = await world.callback(await world.approve(await world.start(bob)), bob)
    assert_page(response, body, 409, "already linked to another account. Unlink it there first")
    assert await world.h.store.get_linked_account(ALICE.sub, "discord") == alices
    assert await world.h.store.get_linked_account(BOB.sub, "discord") is None
    assert world.fake.access_valid(access) and revoked_once_each(world)
    assert not audit.of("chat.stale_link_replaced") and len(audit.of("chat.link_refused")) == 1


def revoked_once_each(world) -> bool:
    """The fake saw the refused link's access and refresh token revoked, and no longer honours them."""
    hints = [hint for _, hint in world.fake.revocations]
    access = next(token for token, hint in world.fake.revocations if hint == "access_token")
    return hints == ["access_token", "refresh_token"] and not world.fake.access_valid(access)


def assert_revocations_failed(world, audit, whose: str) -> None:
    """
    Once both calls' time ran out, neither of a link's tokens is revoked,
    each failure is one warning naming C{whose} tokens, and no token is in
    the log.
    """
    world.h.clock.advance(world.config.timeout)
    world.h.clock.advance(world.config.timeout)
    assert world.fake.revocations == []
    warnings = [formatEvent(e) for e in audit if "could not revoke" in (e.get("log_format") or "")]
    assert warnings == [f"could not revoke {whose} {hint} at discord: ChatProviderUnavailable"
                        for hint in ("access_token", "refresh_token")], warnings
    assert not any(token in formatEvent(e) for e in audit for token in world.fake.tokens())


@pytest_twisted.ensureDeferred
async def test_a_refused_links_revocation_never_holds_up_the_page(world, audit):
    """A revocation the provider leaves unanswered: the 409 page comes at once, the failure is logged, no token."""
    alice = await world.sign_in()
    await world.callback(await world.approve(await world.start(alice)), alice)
    world.fake.hold_revocations = True
    bob = await world.sign_in(BOB.sub)
    response, body = await world.callback(await world.approve(await world.start(bob)), bob)
    assert_page(response, body, 409, "already linked to another account")
    assert world.fake.revocations == []

    assert_revocations_failed(world, audit, "a refused link's")


@pytest_twisted.ensureDeferred
async def test_link_without_pkce(tmp_path, monkeypatch):
    harness = await Harness(tmp_path, monkeypatch).start()
    try:
        world = LinkWorld(harness, pkce_enabled=False)
        cookie = await world.sign_in()
        authorize_url = await world.start(cookie)
        assert "code_challenge" not in query_of(authorize_url)
        response, body = await world.callback(await world.approve(authorize_url), cookie)
        assert_page(response, body, 200, "Chat account linked")
    finally:
        await harness.close()


def sends_to_sign_in(response) -> bool:
    """The start page's answer to a browser without a session: the login form of a sign-in that comes back."""
    return response.code == 303 and location(response).startswith(ISSUER + "/login?request=")


@pytest_twisted.ensureDeferred
async def test_no_session_no_link(world):
    response, _ = await world.get(LINK)
    assert sends_to_sign_in(response)
    response, _ = await world.get(LINK, "not-a-session")
    assert sends_to_sign_in(response)
    expired = await world.sign_in(ttl=10)
    world.h.clock.advance(10)
    response, _ = await world.get(LINK, expired)
    assert sends_to_sign_in(response)
    assert await world.h.store.get_linked_account(ALICE.sub, "discord") is None


@pytest_twisted.ensureDeferred
async def test_without_a_session_the_start_page_signs_in_and_comes_back(world):
    for opened in (LINK, LINK + "?next=https://evil.example/", LINK + "?return_to=//evil.example"):
        browser = Browser(world.h)
        response, _ = await browser.get(opened)
        assert sends_to_sign_in(response)
        response, _ = await browser.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and location(response) == ISSUER + "/link/chat", opened

    response, body = await browser.get(location(response))
    assert_page(response, body, 200, "Link your discord account")
    response, _ = await browser.post(ISSUER + "/link/chat", {"csrf": csrf_of(body)})
    assert response.code == 303
    response, body = await browser.get(await world.approve(location(response)))
    assert_page(response, body, 200, "Chat account linked")
    assert (await world.h.store.get_linked_account(ALICE.sub, "discord")).provider_user_id == world.fake.user.id


@pytest_twisted.ensureDeferred
async def test_sign_ins_the_start_page_starts_count_toward_the_address_cap(tmp_path, monkeypatch):
    harness = await Harness(tmp_path, monkeypatch, {"limits": {"pending_per_address": 2}}).start()
    try:
        world = LinkWorld(harness)
        for _ in range(2):
            response, _ = await world.get(LINK)
            assert sends_to_sign_in(response)
        response, body = await world.get(LINK)
        assert_page(response, body, 429, "Too many sign-ins")
        assert response.headers.getRawHeaders(b"location") is None
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_posts_without_a_session_stay_refused(world):
    response, body = await world.h.post(LINK + "/unlink", {"csrf": "x"})
    assert_page(response, body, 401, "Sign in at the application first")
    assert response.headers.getRawHeaders(b"location") is None


@pytest_twisted.ensureDeferred
async def test_banned_or_disabled_users_cannot_link(world):
    disabled = await world.sign_in(MALLORY.sub)
    response, body = await world.get(LINK, disabled)
    assert_page(response, body, 403, "may not link")
    bob = await world.sign_in(BOB.sub)
    await world.h.store.ban_user(Ban(BOB.sub, "spam", world.h.now()))
    response, body = await world.get(LINK, bob)
    assert_page(response, body, 403, "may not link")


@pytest_twisted.ensureDeferred
async def test_callback_needs_the_same_session(world):
    cookie = await world.sign_in()
    back = await world.approve(await world.start(cookie))

    response, body = await world.callback(back, None)
    assert_page(response, body, 401, "Sign in")
    other = await world.sign_in()
    response, body = await world.callback(back, other)
    assert_page(response, body, 400, "started in another browser")
    bob = await world.sign_in(BOB.sub)
    response, body = await world.callback(back, bob)
    assert_page(response, body, 400, "started in another browser")
    assert world.fake.exchanges == 0

    # The rightful browser can still finish, once.
    response, body = await world.callback(back, cookie)
    assert_page(response, body, 200, "linked")
    response, body = await world.callback(back, cookie)
    assert_page(response, body, 400, "already used")
    assert world.fake.exchanges == 1
    assert await world.h.store.get_linked_account(BOB.sub, "discord") is None


@pytest.mark.parametrize("query, status, words", [
    ("", 400, "without the link attempt"),
    ("?code=abc", 400, "without the link attempt"),
    ("?code=abc&state=forged", 400, "has expired"),
    ("?code=abc&state=%FF", 400, "UTF-8"),
    ("?code=a&code=b&state=x", 400, "repeated"),
    ("?state=x&error=access_denied", 200, "Linking was cancelled"),
    ("?error=server_error", 502, "linking was cancelled"),
    ("?state=" + "x" * 10000, 400, "too long"),
])
@pytest_twisted.ensureDeferred
async def test_bad_callbacks_are_pages(world, query, status, words):
    cookie = await world.sign_in()
    response, body = await world.get(LINK + "/callback" + query, cookie)
    assert_page(response, body, status, words)


@pytest_twisted.ensureDeferred
async def test_provider_denial_cancels_the_attempt(world):
    cookie = await world.sign_in()
    world.fake.deny = True
    authorize_url = await world.start(cookie)
    response, body = await world.callback(await world.approve(authorize_url), cookie)
    assert_page(response, body, 200, "Linking cancelled")
    state = query_of(authorize_url)["state"]
    assert await world.h.store.take_link_attempt(token_hash(state), token_hash(cookie), world.h.now()) is None
    assert await world.h.store.get_linked_account(ALICE.sub, "discord") is None


@pytest_twisted.ensureDeferred
async def test_missing_code_and_expired_attempt(world):
    cookie = await world.sign_in()
    state = query_of(await world.start(cookie))["state"]
    response, body = await world.get(f"{LINK}/callback?state={state}", cookie)
    assert_page(response, body, 400, "without a code")

    back = await world.approve(await world.start(cookie))
    world.h.clock.advance(601)
    response, body = await world.callback(back, await world.sign_in())
    assert_page(response, body, 400, "has expired")


@pytest.mark.parametrize("switch, status, words", [
    ("down", 503, "cannot be reached"),
    ("unavailable", 503, "cannot be reached"),
])
@pytest_twisted.ensureDeferred
async def test_provider_down_at_callback(world, switch, status, words):
    cookie = await world.sign_in()
    back = await world.approve(await world.start(cookie))
    setattr(world.fake, switch, True)
    response, body = await world.callback(back, cookie)
    assert_page(response, body, status, words)
    assert await world.h.store.get_linked_account(ALICE.sub, "discord") is None


@pytest_twisted.ensureDeferred
async def test_tokens_of_a_link_the_platform_cannot_name_the_user_of_are_revoked(world):
    """The code was redeemed, then the platform did not say whose the tokens are: no one keeps them, so they end."""
    cookie = await world.sign_in()
    back = await world.approve(await world.start(cookie))
    before = set(world.fake.tokens())
    world.fake.user_unavailable = True
    response, body = await world.callback(back, cookie)
    assert_page(response, body, 503, "cannot be reached")
    assert world.fake.exchanges == 1 and await world.h.store.get_linked_account(ALICE.sub, "discord") is None
    issued = {token for token, _ in world.fake.revocations}
    assert sorted(hint for _, hint in world.fake.revocations) == ["access_token", "refresh_token"]
    assert not issued & (before | set(world.fake.tokens())), "the redeemed code's tokens still work"


@pytest_twisted.ensureDeferred
async def test_rejected_code(world):
    cookie = await world.sign_in()
    back = await world.approve(await world.start(cookie))
    code = query_of(back)["code"]
    forged = back.replace(code, "forged-code")
    response, body = await world.callback(forged, cookie)
    assert_page(response, body, 400, "did not accept")


@pytest_twisted.ensureDeferred
async def test_unlink(world):
    cookie = await world.sign_in()
    response, body = await world.callback(await world.approve(await world.start(cookie)), cookie)
    token = csrf_of(body)
    assert token == unlink_token(cookie)
    assert f'action="{ISSUER}/link/chat/unlink"'.encode() in body

    response, body = await world.h.post(LINK + "/unlink", {"csrf": token})
    assert_page(response, body, 401, "Sign in")
    other = await world.sign_in()
    for forged in ({}, {"csrf": "0" * 64}, {"csrf": unlink_token(other)}):
        response, body = await world.h.post(LINK + "/unlink", forged, headers=session_header(cookie))
        assert_page(response, body, 403, "This form has expired")
    assert await world.h.store.get_linked_account(ALICE.sub, "discord") is not None

    response, body = await world.h.post(LINK + "/unlink", {"csrf": token}, headers=session_header(cookie))
    assert_unlinked(response, "chat-unlinked")
    assert await world.h.store.get_linked_account(ALICE.sub, "discord") is None
    response, body = await world.h.post(LINK + "/unlink", {"csrf": token}, headers=session_header(cookie))
    assert_unlinked(response, "chat-gone")


@pytest_twisted.ensureDeferred
async def test_unlinking_revokes_the_links_tokens_at_the_provider(world, audit):
    """
    Unlinking dropped the stored tokens but left them valid at the chat
    platform, where the service still showed as connected: they are revoked
    there after the answer, which never waits for the provider.
    """
    cookie = await world.sign_in()

    async def unlink_new_link():
        response, body = await world.callback(await world.approve(await world.start(cookie)), cookie)
        linked = await world.h.store.get_linked_account(ALICE.sub, "discord")
        response, body = await world.h.post(LINK + "/unlink", {"csrf": csrf_of(body)}, headers=session_header(cookie))
        assert_unlinked(response, "chat-unlinked")
        return (world.cipher.decrypt(linked.access_token_enc, linked.account_id, ACCESS),
                world.cipher.decrypt(linked.refresh_token_enc, linked.account_id, REFRESH))

    world.fake.hold_revocations = True
    await unlink_new_link()
    assert_revocations_failed(world, audit, "an unlinked account's")

    world.fake.hold_revocations = False
    access, refresh = await unlink_new_link()
    assert world.fake.revocations == [(access, "access_token"), (refresh, "refresh_token")]
    assert not world.fake.access_valid(access)


async def link_then_remove_through_the_admin_api(world, failure: str | None = None) -> tuple[str, str]:
    """
    Alice's new link's tokens, after the operator removed her (204) and her
    link with her; C{failure}: the fake platform's switch turned on between.
    """
    cookie = await world.sign_in()
    response, _ = await world.callback(await world.approve(await world.start(cookie)), cookie)
    assert response.code == 200
    linked = await world.h.store.get_linked_account(ALICE.sub, "discord")
    if failure is not None:
        setattr(world.fake, failure, True)
    admin = Admin(world.h, revoke_link=world.linking.revoke_removed)
    response, _ = await admin.call("DELETE", f"/api/admin/users/{ALICE.login}", headers=ADMIN_AUTH)
    assert response.code == 204
    assert await world.h.store.get_linked_account(ALICE.sub, "discord") is None
    assert await world.h.identity.user_by_id(ALICE.sub) is None
    return (world.cipher.decrypt(linked.access_token_enc, linked.account_id, ACCESS),
            world.cipher.decrypt(linked.refresh_token_enc, linked.account_id, REFRESH))


@pytest_twisted.ensureDeferred
async def test_removing_a_user_revokes_their_links_tokens_at_the_provider(world):
    """
    The operator's user removal dropped the link's stored tokens but left
    them valid at the chat platform: they are revoked there as at unlinking.
    """
    access, refresh = await link_then_remove_through_the_admin_api(world)
    assert world.fake.revocations == [(access, "access_token"), (refresh, "refresh_token")]
    assert not world.fake.access_valid(access)


@pytest_twisted.ensureDeferred
async def test_the_servers_user_removal_revokes_through_its_link_flow(world):
    """The server's admin operations are given its link flow to revoke a removed user's link's tokens with."""
    cookie = await world.sign_in()
    await world.callback(await world.approve(await world.start(cookie)), cookie)
    h = world.h
    operations = admin_operations(evolve(h.config, chat=world.config), h.clock, h.store, h.keystore, h.identity,
                                  h.context, backchannel_notifier(h.clock), world.linking)
    await operations.users.delete(ALICE.login, actor="operator")
    assert [hint for _, hint in world.fake.revocations] == ["access_token", "refresh_token"]


@pytest.mark.parametrize("failure", ["down", "hold_revocations"])
@pytest_twisted.ensureDeferred
async def test_a_platform_down_or_silent_never_fails_or_holds_up_a_user_removal(world, audit, failure):
    """
    A platform that is down or leaves the revocation unanswered: the user
    is removed at once all the same, the failure logged without a token.
    """
    await link_then_remove_through_the_admin_api(world, failure)
    assert_revocations_failed(world, audit, "a removed user's")


@pytest_twisted.ensureDeferred
async def test_unlinking_revokes_the_tokens_the_removed_link_held(world):
    """
    The tokens revoked are those of the link the store removed, not those
    read before: a refresh (the internal chat-token API) that replaced them
    meanwhile left the new ones valid at the platform, dropped unrevoked.
    """
    cookie = await world.sign_in()
    response, body = await world.callback(await world.approve(await world.start(cookie)), cookie)
    store = world.h.store
    unlink = store.unlink_account

    async def refreshed_then_unlinked(sub, provider):
        linked = await store.get_linked_account(sub, provider)
        fresh = world.fake.grant()
        await store.update_linked_tokens(
            linked.account_id, linked.version,
            world.cipher.encrypt(fresh["access_token"], linked.account_id, ACCESS),
            world.cipher.encrypt(fresh["refresh_token"], linked.account_id, REFRESH),
            linked.scope, linked.expires_at, world.h.now())
        refreshed.append(fresh)
        return await unlink(sub, provider)

    refreshed: list[dict] = []
    store.unlink_account = refreshed_then_unlinked
    response, body = await world.h.post(LINK + "/unlink", {"csrf": csrf_of(body)}, headers=session_header(cookie))
    assert_unlinked(response, "chat-unlinked")
    [fresh] = refreshed
    assert world.fake.revocations == [(fresh["access_token"], "access_token"), (fresh["refresh_token"], "refresh_token")]
    assert not world.fake.access_valid(fresh["access_token"])


@pytest_twisted.ensureDeferred
async def test_link_pages_when_linking_is_not_configured(tmp_path, monkeypatch):
    harness = await Harness(tmp_path, monkeypatch).start()
    try:
        world = LinkWorld(harness, linking=False)
        cookie = await world.sign_in()
        for path in (LINK, LINK + "/callback?code=a&state=b"):
            response, body = await world.get(path, cookie)
            assert_page(response, body, 404, "does not link chat accounts")
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_refused_callback_names_no_parameter_of_the_request(world):
    """Whoever makes the link chooses its parameters' names: the error page shows none of them."""
    cookie = await world.sign_in()
    response, body = await world.get(f"{LINK}/callback?state=x&{SPOOF}=1&{SPOOF}=2", cookie)
    assert_page(response, body, 400, "repeated")
    assert b"locked" not in body
