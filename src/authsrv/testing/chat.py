"""
The chat-provider conformance suite.

The link flow and the chat-token endpoint rely on the outcomes that
L{authsrv.interfaces.IChatProvider} documents: tokens or a rejected code,
rotated or kept refresh tokens, a refused refresh, and an unavailable
provider for everything that decides nothing. The suite proves them against
the fake platform of L{authsrv.testing.fake_chat}, whose switches make it
refuse, fail, stall or answer garbage.

To run it, subclass L{ChatProviderConformance} in a C{Test*} class and
define C{connect(fake)}: an async context manager that yields the provider
under test pointed at C{fake} (a L{FakeChatProvider}) through its
L{endpoints}, timing its calls out after L{TIMEOUT} seconds of
C{fake.clock}, and that stops whatever it started on the way out.

The clock is a L{twisted.internet.task.Clock}, so nothing sleeps; over a
real connection the suite only lets the reactor run until the fake has the
request in hand.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from urllib.parse import parse_qs, urlsplit

import pytest
import pytest_twisted
from treq.client import HTTPClient
from treq.testing import RequestTraversalAgent
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import Clock, deferLater
from zope.interface.verify import verifyObject

from authsrv.chat.errors import ChatProviderUnavailable, ChatRefreshRefused
from authsrv.chat.provider import ChatCodeRejected, ProviderTokens
from authsrv.interfaces import IChatProvider
from authsrv.protocol import pkce
from authsrv.testing.fake_chat import AUTHORIZE_PATH, FakeChatProvider

TIMEOUT = 10
"""Seconds of C{fake.clock} the provider under test waits for an answer."""

AUTHORIZE_QUERY = "prompt=consent"
"""The authorize endpoint's own query, which the authorize URL must keep."""

REDIRECT_URI = "https://auth.example.test/link/chat/callback"
STATE = "the-state"

FAILURES = ("down", "unavailable", "oversized", "not_json")
"""The fake's switches after which every call is L{ChatProviderUnavailable}."""


def endpoints(fake: FakeChatProvider, base_url: str) -> dict[str, str]:
    """
    The C{[chat]} keys that point a provider at C{fake} served at
    C{base_url}: its client credentials and endpoints, the authorize
    endpoint carrying L{AUTHORIZE_QUERY}.
    """
    keys = fake.endpoints(base_url)
    return {
        **keys,
        "client_secret": fake.client_secret,
        "authorize_url": f"{keys['authorize_url']}?{AUTHORIZE_QUERY}",
    }


def _pkce_pair() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(32)
    return verifier, pkce.s256(verifier)


def _query(url: str) -> dict[str, str]:
    return {name: values[0] for name, values in parse_qs(urlsplit(url).query).items()}


async def _until(condition, what: str) -> None:
    """Let the reactor deliver (a real connection needs it) until C{condition()} holds."""
    for _ in range(1000):
        if condition():
            return
        await deferLater(reactor, 0.005, lambda: None)
    raise AssertionError(f"the fake never {what}")


class ChatProviderConformance:
    """Mixin for C{Test*} classes; see the module docstring."""

    @asynccontextmanager
    async def provider(self):
        fake = FakeChatProvider(Clock())
        async with self.connect(fake) as provider:
            yield fake, provider

    @staticmethod
    async def approve(fake: FakeChatProvider, authorize_url: str) -> str:
        """The browser's round trip through the fake's authorize endpoint; returns the code."""
        browser = HTTPClient(RequestTraversalAgent(fake.resource()))
        response = await browser.get(authorize_url, allow_redirects=False)
        assert response.code == 302, response.code
        back = response.headers.getRawHeaders(b"location")[0].decode()
        assert back.startswith(REDIRECT_URI + "?"), back
        query = _query(back)
        assert query["state"] == STATE
        return query["code"]

    async def prepare(self, fake: FakeChatProvider, provider, method: str) -> Callable[[], Awaitable]:
        """
        A call of C{method} with a credential the fake accepts (a code,
        approved now so that a switch set afterwards meets the call only; a
        refresh token; an access token), to be made when the test likes.
        """
        if method == "exchange_code":
            verifier, challenge = _pkce_pair()
            code = await self.approve(fake, provider.authorize_url(STATE, challenge, REDIRECT_URI))
            return lambda: provider.exchange_code(code, verifier, REDIRECT_URI)
        grant = fake.grant()
        if method == "refresh":
            return lambda: provider.refresh(grant["refresh_token"])
        return lambda: provider.current_user(grant["access_token"])

    # --- the interface ------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_provides_interface(self):
        async with self.provider() as (_, provider):
            assert verifyObject(IChatProvider, provider)
            assert isinstance(provider.name, str) and provider.name

    # --- the authorize URL --------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_authorize_url_carries_the_request_and_keeps_the_endpoints_query(self):
        async with self.provider() as (fake, provider):
            _, challenge = _pkce_pair()
            url = provider.authorize_url(STATE, challenge, REDIRECT_URI)
            parts = urlsplit(url)
            assert parts.path == AUTHORIZE_PATH and not parts.fragment
            query = parse_qs(parts.query)
            assert all(len(values) == 1 for values in query.values()), query
            assert query["prompt"] == ["consent"]
            assert {name: query[name][0] for name in (
                "response_type", "client_id", "redirect_uri", "state", "code_challenge", "code_challenge_method",
            )} == {
                "response_type": "code", "client_id": fake.client_id, "redirect_uri": REDIRECT_URI,
                "state": STATE, "code_challenge": challenge, "code_challenge_method": "S256",
            }

    @pytest_twisted.ensureDeferred
    async def test_authorize_url_without_a_challenge(self):
        async with self.provider() as (_, provider):
            query = _query(provider.authorize_url(STATE, None, REDIRECT_URI))
            assert "code_challenge" not in query and "code_challenge_method" not in query
            assert (query["state"], query["redirect_uri"]) == (STATE, REDIRECT_URI)

    # --- the code exchange --------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_code_exchange_gives_tokens_and_the_user(self):
        async with self.provider() as (fake, provider):
            verifier, challenge = _pkce_pair()
            url = provider.authorize_url(STATE, challenge, REDIRECT_URI)
            tokens = await provider.exchange_code(await self.approve(fake, url), verifier, REDIRECT_URI)
            assert isinstance(tokens, ProviderTokens)
            assert fake.exchanges == 1 and fake.access_valid(tokens.access_token)
            assert tokens.refresh_token
            assert (tokens.scope, tokens.expires_in) == (_query(url)["scope"], fake.expires_in)
            assert await provider.current_user(tokens.access_token) == fake.user.id

    @pytest_twisted.ensureDeferred
    async def test_code_exchange_without_pkce(self):
        async with self.provider() as (fake, provider):
            code = await self.approve(fake, provider.authorize_url(STATE, None, REDIRECT_URI))
            tokens = await provider.exchange_code(code, None, REDIRECT_URI)
            assert fake.access_valid(tokens.access_token)

    @pytest.mark.parametrize("wrong", ["forged code", "other verifier", "no verifier", "other redirect_uri", "reused"])
    @pytest_twisted.ensureDeferred
    async def test_a_wrong_or_reused_code_is_rejected(self, wrong):
        async with self.provider() as (fake, provider):
            verifier, challenge = _pkce_pair()
            code = await self.approve(fake, provider.authorize_url(STATE, challenge, REDIRECT_URI))
            redirect_uri = REDIRECT_URI
            if wrong == "forged code":
                code = "forged-" + code
            elif wrong == "other verifier":
                verifier = _pkce_pair()[0]
            elif wrong == "no verifier":
                verifier = None
            elif wrong == "other redirect_uri":
                redirect_uri = REDIRECT_URI + "/elsewhere"
            else:
                await provider.exchange_code(code, verifier, redirect_uri)
            with pytest.raises(ChatCodeRejected):
                await provider.exchange_code(code, verifier, redirect_uri)
            assert fake.exchanges == (1 if wrong == "reused" else 0)

    # --- refresh ------------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_refresh_rotates_the_refresh_token(self):
        async with self.provider() as (fake, provider):
            grant = fake.grant()
            tokens = await provider.refresh(grant["refresh_token"])
            assert fake.refreshes == 1 and fake.access_valid(tokens.access_token)
            assert tokens.refresh_token not in (None, grant["refresh_token"])
            assert (tokens.scope, tokens.expires_in) == (grant["scope"], fake.expires_in)
            with pytest.raises(ChatRefreshRefused):
                await provider.refresh(grant["refresh_token"])
            assert fake.access_valid((await provider.refresh(tokens.refresh_token)).access_token)

    @pytest_twisted.ensureDeferred
    async def test_refresh_without_rotation_leaves_the_old_token_to_the_caller(self):
        async with self.provider() as (fake, provider):
            fake.rotate_refresh = False
            grant = fake.grant()
            for served in (1, 2):
                tokens = await provider.refresh(grant["refresh_token"])
                assert tokens.refresh_token is None, "the caller keeps the refresh token it holds"
                assert fake.refreshes == served and fake.access_valid(tokens.access_token)

    @pytest.mark.parametrize("refused", ["refused by the provider", "unknown token"])
    @pytest_twisted.ensureDeferred
    async def test_a_refused_refresh(self, refused):
        async with self.provider() as (fake, provider):
            token = fake.grant()["refresh_token"]
            if refused == "unknown token":
                token = "unknown-" + token
            else:
                fake.refuse_refresh = True
            with pytest.raises(ChatRefreshRefused):
                await provider.refresh(token)
            assert fake.refreshes == 0

    # --- the current user ---------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_current_user_of_a_refused_access_token_is_unavailable(self):
        async with self.provider() as (fake, provider):
            with pytest.raises(ChatProviderUnavailable):
                await provider.current_user("unknown-" + fake.grant()["access_token"])

    # --- revocation ---------------------------------------------------------

    @pytest_twisted.ensureDeferred
    async def test_revoke_ends_both_tokens(self):
        async with self.provider() as (fake, provider):
            grant = fake.grant()
            await provider.revoke(grant["access_token"], "access_token")
            await provider.revoke(grant["refresh_token"], "refresh_token")
            assert fake.revocations == [(grant["access_token"], "access_token"),
                                        (grant["refresh_token"], "refresh_token")]
            assert not fake.access_valid(grant["access_token"])
            with pytest.raises(ChatRefreshRefused):
                await provider.refresh(grant["refresh_token"])

    @pytest.mark.parametrize("switch", ["down", "unavailable", "oversized"])
    @pytest_twisted.ensureDeferred
    async def test_a_failed_revocation_is_unavailable(self, switch):
        async with self.provider() as (fake, provider):
            setattr(fake, switch, True)
            with pytest.raises(ChatProviderUnavailable):
                await provider.revoke(fake.grant()["access_token"], "access_token")

    @pytest_twisted.ensureDeferred
    async def test_an_unanswered_revocation_times_out(self):
        async with self.provider() as (fake, provider):
            fake.hold_revocations = True
            d = ensureDeferred(provider.revoke(fake.grant()["access_token"], "access_token"))
            fake.clock.advance(TIMEOUT)
            assert d.called, "the revocation outlived its timeout"
            with pytest.raises(ChatProviderUnavailable):
                await d

    # --- a provider that decides nothing ------------------------------------

    @pytest.mark.parametrize("method", ["exchange_code", "refresh", "current_user"])
    @pytest.mark.parametrize("switch", FAILURES)
    @pytest_twisted.ensureDeferred
    async def test_failures_are_unavailable(self, switch, method):
        async with self.provider() as (fake, provider):
            call = await self.prepare(fake, provider, method)
            setattr(fake, switch, True)
            with pytest.raises(ChatProviderUnavailable):
                await call()
            setattr(fake, switch, False)
            assert await (await self.prepare(fake, provider, method))()

    @pytest.mark.parametrize("method", ["exchange_code", "refresh", "current_user"])
    @pytest_twisted.ensureDeferred
    async def test_slow_within_the_timeout_answers(self, method):
        async with self.provider() as (fake, provider):
            call = await self.prepare(fake, provider, method)
            fake.slow = TIMEOUT - 1
            d = ensureDeferred(call())
            await _until(lambda: fake.held == 1, "received the request")
            fake.clock.advance(TIMEOUT - 2)
            assert not d.called
            fake.clock.advance(1)
            assert await d

    @pytest.mark.parametrize("method", ["exchange_code", "refresh", "current_user"])
    @pytest_twisted.ensureDeferred
    async def test_slow_beyond_the_timeout_is_unavailable(self, method):
        async with self.provider() as (fake, provider):
            call = await self.prepare(fake, provider, method)
            fake.slow = TIMEOUT + 5
            d = ensureDeferred(call())
            await _until(lambda: fake.held == 1, "received the request")
            fake.clock.advance(TIMEOUT - 1)
            assert not d.called
            fake.clock.advance(1)
            assert d.called, "the call outlived its timeout"
            with pytest.raises(ChatProviderUnavailable):
                await d
            assert (fake.exchanges, fake.refreshes) == (0, 0)
