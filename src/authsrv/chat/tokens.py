"""
Fresh provider tokens for the internal chat-token endpoint (docs/design.md,
Linked chat accounts): a stored token that expires within C{refresh_margin}
is refreshed at the provider before it is handed out, so first-party
services never receive an expired token.

Concurrent callers, on this instance or on others sharing the store, cause
one upstream refresh: the refresh runs under the account's lease in the store
(C{acquire_link_lock}), never a lock in process memory. A caller that finds
the lease taken polls the store until the holder has saved the new token or
the lease has run out. The new tokens are saved with a compare-and-swap on
the link's version, and a provider that sends no new refresh token keeps the
stored one, so a rotated upstream token is never lost. A refresh, once
under way, ends (saved, lease released) even when the caller that started
it goes away: the provider may already have rotated the refresh token.

Unlinking takes no lease: a refresh may meet a link that went while the
provider answered. Its caller is then told the account is not linked, and
the tokens the provider just gave are revoked, as unlinking revokes the
ones it removed, so the service keeps no grant there the user ended.
"""

from __future__ import annotations

import itertools

from attrs import evolve, field, frozen
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from authsrv import events
from authsrv.chat.crypto import ACCESS, REFRESH, UndecryptableToken
from authsrv.chat.errors import ChatError, ChatNotLinked, ChatProviderUnavailable, ChatRefreshRefused
from authsrv.chat.provider import ProviderTokens, revoke_tokens
from authsrv.interfaces import IChatLinkSource, IChatProvider
from authsrv.records import LinkedAccount, SourceChatLink
from authsrv.tokens import new_token

SOURCE_PREFIX = "source:"
"""Marks the account id of a link read from the identity backend (L{IChatLinkSource})."""

POLL_FIRST = 0.05
POLL_MAX = 0.5
"""Seconds between a waiting caller's looks at the store: doubling from the first to the max."""

log = Logger()


@frozen
class ProviderToken:
    """What the chat-token endpoint answers; the token itself is never in a repr."""

    account_id: str
    access_token: str = field(repr=False)
    scope: str
    expires_at: int


class ChatTokens:
    """
    Serves a user's provider access token, refreshed when needed.

    C{provider} (an L{IChatProvider}) is None when no provider client is
    configured: stored tokens are then served while fresh and
    L{ChatProviderUnavailable} answers otherwise. C{cipher} and C{config} are
    None when there is no C{[chat]} section at all. C{source}, when given,
    is an identity backend whose own links (a Better Auth database's) are
    served for users without a link in the store, and written back to it
    when refreshed.
    """

    def __init__(self, reactor, store, identity, provider: IChatProvider | None, cipher, config,
                 source: IChatLinkSource | None = None):
        self._source = source
        self._reactor = reactor
        self._store = store
        self._identity = identity
        self._provider = provider
        self._cipher = cipher
        self._config = config
        self._holder = new_token(9)
        self._calls = itertools.count(1)

    @property
    def provider_name(self) -> str:
        return self._config.provider if self._config is not None else "discord"

    def _now(self, floor: int) -> int:
        return max(floor, int(self._reactor.seconds()))

    async def fresh_token(self, sub: str, now: int) -> ProviderToken:
        """
        The user's provider token, valid for at least C{refresh_margin} unless
        the provider itself grants less; raises L{ChatNotLinked},
        L{ChatProviderUnavailable} or L{ChatRefreshRefused}.
        """
        link = await self._link(sub)
        if await self._identity.user_by_id(sub) is None:
            raise ChatNotLinked("the user has no linked chat-platform account")
        if self._cipher is None:
            raise ChatProviderUnavailable("no chat platform is configured on this server")
        if self._fresh(link, now):
            return self._token(link)
        holder = f"{self._holder}:{next(self._calls)}"
        seen = (link.account_id, link.version)
        deadline = self._reactor.seconds() + self._config.lock_ttl + 1
        delay = POLL_FIRST
        while True:
            token = await _shielded(Deferred.fromCoroutine(self._under_lease(sub, link, seen, holder, now)))
            if token is not None:
                return token
            if self._reactor.seconds() >= deadline:
                raise ChatProviderUnavailable("another refresh of this account is taking too long; try again")
            await deferLater(self._reactor, delay, lambda: None)
            delay = min(delay * 2, POLL_MAX)
            now = self._now(now)
            link = await self._link(sub)
            if self._fresh(link, now) or self._replaced(link, seen, now):
                return self._token(link)

    async def _under_lease(self, sub: str, link: LinkedAccount, seen: tuple[str, int], holder: str,
                           now: int) -> ProviderToken | None:
        """The refresh under the account's lease, or None when another holds it."""
        if not await self._store.acquire_link_lock(link.account_id, holder, now, self._config.lock_ttl):
            return None
        try:
            return await self._refresh_held(sub, link, seen, now)
        finally:
            await self._release(link.account_id, holder)

    async def _release(self, account_id: str, holder: str) -> None:
        """Free the lease; if the store fails, it runs out by itself after C{lock_ttl}."""
        try:
            await self._store.release_link_lock(account_id, holder)
        except Exception as e:
            log.warn("could not release the refresh lease of chat link {account_id}: {error}",
                     account_id=account_id, error=str(e) or type(e).__name__)

    async def _link(self, sub: str) -> LinkedAccount:
        link = await self._store.get_linked_account(sub, self.provider_name)
        if link is None and self._source is not None:
            found = await self._source.chat_link(sub, self.provider_name)
            link = None if found is None else self._from_source(sub, found)
        if link is None:
            raise ChatNotLinked("the user has no linked chat-platform account")
        return link

    def _from_source(self, sub: str, found: SourceChatLink) -> LinkedAccount:
        """The source's link in the store's form (tokens sealed for this call only)."""
        if self._cipher is None:
            raise ChatProviderUnavailable("no chat platform is configured on this server")
        account_id = SOURCE_PREFIX + found.link_id
        return LinkedAccount(
            account_id=account_id, sub=sub, provider=self.provider_name,
            provider_user_id=found.provider_user_id,
            access_token_enc=self._cipher.encrypt(found.access_token, account_id, ACCESS),
            refresh_token_enc=None if found.refresh_token is None else self._cipher.encrypt(
                found.refresh_token, account_id, REFRESH
            ),
            scope=found.scope, expires_at=found.expires_at, updated_at=0, version=found.version,
        )

    async def _save(self, link: LinkedAccount, tokens: ProviderTokens, now: int) -> LinkedAccount | None:
        """Compare-and-swap the refreshed tokens where the link lives; None if it changed meanwhile."""
        scope = link.scope if tokens.scope is None else tokens.scope
        expires_at = now + tokens.expires_in
        if self._source is not None and link.account_id.startswith(SOURCE_PREFIX):
            saved = await self._source.save_chat_tokens(
                link.account_id.removeprefix(SOURCE_PREFIX), link.version, tokens.access_token,
                tokens.refresh_token, scope, expires_at,
            )
            return evolve(link, scope=scope, expires_at=expires_at) if saved else None
        return await self._store.update_linked_tokens(
            link.account_id,
            link.version,
            self._cipher.encrypt(tokens.access_token, link.account_id, ACCESS),
            None if tokens.refresh_token is None else self._cipher.encrypt(
                tokens.refresh_token, link.account_id, REFRESH
            ),
            scope,
            expires_at,
            now,
        )

    def _fresh(self, link: LinkedAccount, now: int) -> bool:
        return link.expires_at > now + self._config.refresh_margin

    @staticmethod
    def _replaced(link: LinkedAccount, seen: tuple[str, int], now: int) -> bool:
        """
        Someone refreshed (or relinked) since we looked: take their token while
        it is valid, even if the provider grants less than the margin, rather
        than refreshing again.
        """
        return (link.account_id, link.version) != seen and link.expires_at > now

    def _decrypt(self, link: LinkedAccount, blob: bytes, kind: str) -> str:
        try:
            return self._cipher.decrypt(blob, link.account_id, kind)
        except UndecryptableToken as e:
            log.error(
                "stored {kind} token of chat link {account_id} cannot be decrypted ({problem}):"
                " was [chat] encryption_key changed? The user must link again.",
                kind=kind, account_id=link.account_id, problem=str(e),
            )
            raise ChatNotLinked("the stored chat-platform token is unusable; link the account again") from None

    def _token(self, link: LinkedAccount) -> ProviderToken:
        return ProviderToken(
            _record_id(link), self._decrypt(link, link.access_token_enc, ACCESS), link.scope, link.expires_at
        )

    async def _refresh_held(self, sub: str, link: LinkedAccount, seen: tuple[str, int], now: int) -> ProviderToken:
        """Under the lease: look again, then refresh at the provider and save by compare-and-swap."""
        current = await self._link(sub)
        if self._fresh(current, now) or self._replaced(current, seen, now):
            return self._token(current)
        if current.account_id != link.account_id:
            raise ChatProviderUnavailable("the account was linked again during the refresh; try again")
        try:
            tokens = await self._refresh_upstream(current)
        except ChatError as e:
            events.chat_refresh_failed(
                sub=sub, provider=self.provider_name, account_id=current.account_id, reason=e.code
            )
            # Unlinked or linked again meanwhile: a refusal of the old refresh token then says nothing.
            latest = await self._latest(sub)
            if latest is None:
                raise ChatNotLinked("the user unlinked the chat-platform account") from None
            if self._replaced(latest, (current.account_id, current.version), now):
                return self._token(latest)
            raise
        updated = await self._save(current, tokens, now)
        if updated is None:
            return await self._unsaved(sub, current, tokens, now)
        events.chat_refreshed(
            sub=sub, provider=self.provider_name, account_id=current.account_id,
            rotated=tokens.refresh_token is not None,
        )
        return ProviderToken(_record_id(updated), tokens.access_token, updated.scope, updated.expires_at)

    async def _unsaved(self, sub: str, link: LinkedAccount, tokens: ProviderTokens, now: int) -> ProviderToken:
        """
        The link changed while the provider refreshed it. When the user no
        longer links that chat account (unlinked, or linked another), the
        new tokens are nobody's: they are revoked without the caller
        waiting. Those of an account still linked are left, since revoking
        them may end its whole grant there, the stored tokens' too.
        """
        log.warn("chat link {account_id} changed during its refresh", account_id=link.account_id)
        latest = await self._latest(sub)
        if latest is None or latest.provider_user_id != link.provider_user_id:
            Deferred.fromCoroutine(revoke_tokens(self._upstream(), "an unlinked account's refreshed",
                                                 tokens.access_token, tokens.refresh_token))
        if latest is None:
            raise ChatNotLinked("the user unlinked the chat-platform account")
        if latest.expires_at > now:
            return self._token(latest)
        raise ChatProviderUnavailable("the account changed during the refresh; try again")

    async def _latest(self, sub: str) -> LinkedAccount | None:
        """The user's link as it is now, None when it is gone."""
        try:
            return await self._link(sub)
        except ChatNotLinked:
            return None

    def _upstream(self) -> IChatProvider:
        if self._provider is None:
            raise ChatProviderUnavailable("no chat provider is configured to refresh the expiring token")
        return self._provider

    async def _refresh_upstream(self, link: LinkedAccount) -> ProviderTokens:
        provider = self._upstream()
        if link.refresh_token_enc is None:
            raise ChatRefreshRefused("the stored link has no refresh token; link the account again")
        return await provider.refresh(self._decrypt(link, link.refresh_token_enc, REFRESH))


def _shielded(work: Deferred) -> Deferred:
    """
    C{work}'s result, for a caller that may go away: cancelling what this
    returns (the endpoint's client disconnected or timed out) leaves
    C{work} running. A refresh the provider may already have answered by
    rotating the refresh token must end with the new tokens saved and the
    lease released, or the link would keep a refresh token the provider no
    longer honours.
    """
    answer: Deferred = Deferred()

    def relay(result):
        if not answer.called:
            if isinstance(result, Failure):
                answer.errback(result)
            else:
                answer.callback(result)
        elif isinstance(result, Failure) and not result.check(ChatError):
            log.failure("a chat token refresh failed after its caller went away", result)
        return None

    work.addBoth(relay)
    return answer


def _record_id(link: LinkedAccount) -> str:
    """The linked-account record's id as its holder knows it (a source's own id, unprefixed)."""
    return link.account_id.removeprefix(SOURCE_PREFIX)
