"""
Linking a chat-platform account to the signed-in user (docs/design.md, Linked
chat accounts), HTTP-free: the web layer renders what these return, and
L{PageError} for what the user must be told instead.

The attempt is kept server-side, so that it works across instances: a
L{LinkAttempt} under the hash of the random C{state}, holding the user, the
browser session that started it and the PKCE verifier, for L{LINK_TTL}
seconds. The callback must come back in that same session and can be used
once.

Starting a link and unlinking are POSTs carrying a CSRF token bound to the
session cookie (L{authsrv.flows.csrf.session_form_token}): another site's
page can neither start a link in a signed-in browser (to have it come back
linked to an account of the attacker's) nor end one.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from authsrv import events
from authsrv.chat.crypto import ACCESS, REFRESH, UndecryptableToken
from authsrv.chat.errors import ChatProviderUnavailable
from authsrv.chat.provider import ChatCodeRejected, ProviderTokens, revoke_tokens
from authsrv.flows.csrf import session_form_token, session_form_token_valid
from authsrv.flows.standing import standing
from authsrv.identity.errors import BackendUnavailable
from authsrv.interfaces import IChatProvider
from authsrv.protocol import pkce
from authsrv.protocol.errors import PageError
from authsrv.protocol.urls import origin
from authsrv.records import BrowserSession, LinkAttempt, LinkedAccount
from authsrv.store.errors import AlreadyLinked
from authsrv.tokens import new_token, token_hash

LINK_TTL = 600
_LINK_PURPOSE = b"authsrv chat link"
_UNLINK_PURPOSE = b"authsrv chat unlink"

log = Logger()


def sign_in_first() -> PageError:
    return PageError(
        401, "Sign in first", "Sign in at the application first, then link your chat account from there."
    )


def linked_elsewhere() -> PageError:
    """The chat account is another user's: only its holder can free it."""
    return PageError(
        409, "Chat account already linked",
        "This chat account is already linked to another account. Unlink it there first, then link it here.",
    )


def link_token(cookie_value: str) -> str:
    """The start form's CSRF token for the session this cookie value names."""
    return session_form_token(cookie_value, _LINK_PURPOSE)


def link_token_valid(cookie_value: str, sent: str | None) -> bool:
    return session_form_token_valid(cookie_value, _LINK_PURPOSE, sent)


def unlink_token(cookie_value: str) -> str:
    """The unlink form's CSRF token for the session this cookie value names."""
    return session_form_token(cookie_value, _UNLINK_PURPOSE)


def unlink_token_valid(cookie_value: str, sent: str | None) -> bool:
    return session_form_token_valid(cookie_value, _UNLINK_PURPOSE, sent)


class ChatLinking:
    """The link flow for one provider; C{issuer} names the callback URL."""

    def __init__(self, *, store, identity, provider: IChatProvider, cipher, issuer: str, pkce_enabled: bool):
        self._store = store
        self._identity = identity
        self._provider = provider
        self._cipher = cipher
        self._pkce = pkce_enabled
        self.start_url = f"{issuer}/link/chat"
        self.redirect_uri = f"{issuer}/link/chat/callback"
        self.unlink_url = f"{issuer}/link/chat/unlink"

    @property
    def provider_name(self) -> str:
        return self._provider.name

    @property
    def provider_origin(self) -> str:
        """
        The origin of the provider's authorize endpoint, where the start
        form's redirect ends: the start page's form-action must name it.
        """
        return origin(self._provider.authorize_url("", None, self.redirect_uri))

    async def session(self, cookie_value: str | None, now: int) -> BrowserSession:
        """The live session of a user in good standing, else L{PageError}."""
        session = await self.signed_in(cookie_value, now)
        if session is None:
            raise sign_in_first()
        return session

    async def signed_in(self, cookie_value: str | None, now: int) -> BrowserSession | None:
        """
        The live session of a user in good standing, None without one (the
        start page then signs the browser in), L{PageError} for a user who
        may not link.
        """
        session = await self._store.get_session(token_hash(cookie_value), now) if cookie_value else None
        if session is None:
            return None
        if not (await standing(self._identity, self._store, session.sub, now)).allowed:
            raise PageError(403, "Account not allowed", "This account may not link a chat account.")
        return session

    async def start(self, session: BrowserSession, now: int) -> str:
        """Remember a new attempt; returns the provider's authorize URL to redirect to."""
        state = new_token()
        verifier = new_token() if self._pkce else None
        await self._store.save_link_attempt(LinkAttempt(
            state_hash=token_hash(state), sub=session.sub, session_hash=session.session_hash,
            created_at=now, expires_at=now + LINK_TTL, code_verifier=verifier,
        ))
        challenge = None if verifier is None else pkce.s256(verifier)
        return self._provider.authorize_url(state, challenge, self.redirect_uri)

    async def _take_attempt(self, session: BrowserSession, state: str | None, now: int) -> LinkAttempt:
        """The attempt C{state} names, started in this session; consumed so it works once."""
        if state is None:
            raise PageError(
                400, "Link not completed", "The chat platform sent you back without the link attempt's state."
            )
        attempt = await self._store.take_link_attempt(token_hash(state), session.session_hash, now)
        if attempt is None or attempt.sub != session.sub:
            raise PageError(
                400, "Link not completed",
                "This link attempt has expired, was already used, or was started in another browser. Start again.",
            )
        return attempt

    async def finish(self, session: BrowserSession, params: dict[str, str], now: int,
                     address: str) -> LinkedAccount:
        """
        The provider's redirect back: check the attempt, exchange the code,
        ask who the user is there, and store the link (replacing an earlier one).
        A chat account linked to another user is refused, its tokens dropped
        and revoked at the provider without the user waiting (L{revoke_tokens}).
        The tokens of an earlier link to another chat account are revoked as
        at unlinking; those of the same account are left, since revoking
        them may end the platform's whole grant (RFC 7009 section 2.1), the
        new tokens' too. C{address}: the browser's, for the audit events.
        """
        error = params.get("error")
        if error is not None:
            try:
                await self._take_attempt(session, params.get("state"), now)
            except PageError:
                pass
            if error == "access_denied":
                raise PageError(200, "Linking cancelled", "Linking was cancelled: no chat account was linked.")
            raise PageError(
                502, "Linking cancelled",
                "The chat platform reported a problem, so linking was cancelled. Try again later.",
            )
        attempt = await self._take_attempt(session, params.get("state"), now)
        code = params.get("code")
        if code is None:
            raise PageError(400, "Link not completed", "The chat platform sent you back without a code. Start again.")
        try:
            tokens = await self._provider.exchange_code(code, attempt.code_verifier, self.redirect_uri)
            provider_user_id = await self._user_of(tokens)
        except ChatCodeRejected:
            raise PageError(
                400, "Link not completed", "The chat platform did not accept the link. Start again."
            ) from None
        except ChatProviderUnavailable:
            raise PageError(
                503, "Chat platform unavailable", "The chat platform cannot be reached right now. Try again later."
            ) from None
        account_id = new_token(16)
        account = LinkedAccount(
            account_id=account_id,
            sub=session.sub,
            provider=self.provider_name,
            provider_user_id=provider_user_id,
            access_token_enc=self._cipher.encrypt(tokens.access_token, account_id, ACCESS),
            refresh_token_enc=None if tokens.refresh_token is None else self._cipher.encrypt(
                tokens.refresh_token, account_id, REFRESH
            ),
            scope=tokens.scope,
            expires_at=now + tokens.expires_in,
            updated_at=now,
        )
        try:
            replaced = await self._link(account, address)
        except AlreadyLinked:
            events.chat_link_refused(sub=session.sub, provider=self.provider_name, provider_user_id=provider_user_id,
                                     address=address)
            Deferred.fromCoroutine(revoke_tokens(self._provider, "a refused link's", tokens.access_token,
                                                 tokens.refresh_token))
            raise linked_elsewhere() from None
        events.chat_linked(
            sub=session.sub, provider=self.provider_name, account_id=account_id, provider_user_id=provider_user_id,
            address=address,
        )
        if replaced is not None and replaced.provider_user_id != provider_user_id:
            Deferred.fromCoroutine(self._revoke_stored(replaced, "a replaced link's"))
        return account

    async def _link(self, account: LinkedAccount, address: str) -> LinkedAccount | None:
        """
        Store C{account}, firing with the user's link it replaced. A chat
        account held by a user whom no identity backend knows any more (one
        removed from the directory, the users file or the user table
        directly, where no one removes their link) is taken from them: else
        it would be refused to everyone, that person's new account too, for
        ever. Its tokens are revoked as a replaced link's are. A holder
        known, or one a backend that is down might know, keeps it
        (L{AlreadyLinked}), as does a link changed meanwhile. C{address}:
        the browser's, for the audit event.
        """
        try:
            return await self._store.link_account(account)
        except AlreadyLinked:
            stale = await self._stale_holder(account)
            if stale is None:
                raise
        replaced = await self._store.link_account(account, displacing=stale)
        events.chat_stale_link_replaced(sub=account.sub, provider=self.provider_name, account_id=stale.account_id,
                                        provider_user_id=account.provider_user_id, former_sub=stale.sub,
                                        address=address)
        Deferred.fromCoroutine(self._revoke_stored(stale, "a stale link's"))
        return replaced

    async def _stale_holder(self, account: LinkedAccount) -> LinkedAccount | None:
        """The link holding C{account}'s chat account when the identity backends know its user no more, else None."""
        holder = await self._store.linked_sub(account.provider, account.provider_user_id)
        if holder is None or holder == account.sub:
            return None
        try:
            if await self._identity.user_by_id(holder) is not None:
                return None
        except BackendUnavailable:
            return None
        held = await self._store.get_linked_account(holder, account.provider)
        return held if held is not None and held.provider_user_id == account.provider_user_id else None

    async def _user_of(self, tokens: ProviderTokens) -> str:
        """
        The platform's id of the user the tokens are for. When the platform
        cannot say, the tokens are nobody's (the attempt is used up): they are
        revoked without the user waiting, as a refused link's are.
        """
        try:
            return await self._provider.current_user(tokens.access_token)
        except ChatProviderUnavailable:
            Deferred.fromCoroutine(revoke_tokens(self._provider, "an unfinished link's", tokens.access_token,
                                                 tokens.refresh_token))
            raise

    async def unlink(self, session: BrowserSession, address: str) -> bool:
        """
        Remove the user's link; True when there was one. Its tokens, as the
        store held them when it removed the link (a refresh may have
        replaced the ones read before), are revoked at the provider after
        the answer (L{revoke_tokens}): unlinking disconnects the service from the
        chat account there too, as the user expects. C{address}: the
        browser's, for the audit event.
        """
        removed = await self._store.unlink_account(session.sub, self.provider_name)
        if removed is None:
            return False
        events.chat_unlinked(sub=session.sub, provider=self.provider_name, address=address)
        Deferred.fromCoroutine(self._revoke_stored(removed, "an unlinked account's"))
        return True

    def revoke_removed(self, linked: LinkedAccount) -> Deferred:
        """
        Start revoking the tokens of a removed user's link (the operator's
        user removal), as at unlinking; the Deferred never fails, for a
        caller that must not exit before it settles.
        """
        return Deferred.fromCoroutine(self._revoke_stored(linked, "a removed user's"))

    async def _revoke_stored(self, linked: LinkedAccount, whose: str) -> None:
        """L{revoke_tokens} the tokens of a link removed from the store; ones that no longer open are left."""
        try:
            access = self._cipher.decrypt(linked.access_token_enc, linked.account_id, ACCESS)
            refresh = None if linked.refresh_token_enc is None else self._cipher.decrypt(
                linked.refresh_token_enc, linked.account_id, REFRESH)
        except UndecryptableToken:
            log.warn("could not revoke {whose} tokens at {provider}: they no longer decrypt",
                     whose=whose, provider=self.provider_name)
            return
        await revoke_tokens(self._provider, whose, access, refresh)
