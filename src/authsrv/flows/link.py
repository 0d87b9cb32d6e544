"""
Linking a chat-platform account to the signed-in user (DESIGN.md, Linked
chat accounts), HTTP-free: the routes in L{authsrv.web.routes_link} render
what these return or raise.

The attempt is kept server-side, so that it works across instances: a
L{PendingAuthorization} under the hash of the random C{state}, with client
id L{LINK_CLIENT_ID}, holding the user, the browser session that started it
and the PKCE verifier, for L{LINK_TTL} seconds. The callback must come back
in that same session and can be used once.

Unlinking is a POST whose CSRF token is an HMAC of the session cookie value
keyed by that value itself (L{unlink_token}): only a page that knows the
HttpOnly cookie, i.e. one this service rendered for that browser, can
produce it, and it needs no server-side state.
"""

from __future__ import annotations

import hashlib
import hmac

from authsrv import events
from authsrv.chat.crypto import ACCESS, REFRESH
from authsrv.chat.errors import ChatProviderUnavailable
from authsrv.chat.provider import ChatCodeRejected
from authsrv.flows.standing import standing
from authsrv.interfaces import IChatProvider
from authsrv.protocol import pkce
from authsrv.records import BrowserSession, LinkedAccount, PendingAuthorization
from authsrv.tokens import new_token, token_hash

LINK_CLIENT_ID = "chat-link"
LINK_TTL = 600
_UNLINK_PURPOSE = b"authsrv chat unlink"


class LinkProblem(Exception):
    """What the user sees instead: an HTTP status, a title and one sentence."""

    def __init__(self, status: int, title: str, message: str):
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


def sign_in_first() -> LinkProblem:
    return LinkProblem(
        401, "Sign in first", "Sign in at the application first, then link your chat account from there."
    )


def unlink_token(cookie_value: str) -> str:
    """The unlink form's CSRF token for the session this cookie value names."""
    return hmac.new(cookie_value.encode(), _UNLINK_PURPOSE, hashlib.sha256).hexdigest()


def unlink_token_valid(cookie_value: str, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(unlink_token(cookie_value).encode(), sent.encode())


class ChatLinking:
    """The link flow for one provider; C{issuer} names the callback URL."""

    def __init__(self, *, store, identity, provider: IChatProvider, cipher, issuer: str, pkce_enabled: bool):
        self._store = store
        self._identity = identity
        self._provider = provider
        self._cipher = cipher
        self._pkce = pkce_enabled
        self.redirect_uri = f"{issuer}/link/chat/callback"
        self.unlink_url = f"{issuer}/link/chat/unlink"

    @property
    def provider_name(self) -> str:
        return self._provider.name

    async def session(self, cookie_value: str | None, now: int) -> BrowserSession:
        """The live session of a user in good standing, else L{LinkProblem}."""
        session = await self._store.get_session(token_hash(cookie_value), now) if cookie_value else None
        if session is None:
            raise sign_in_first()
        if not (await standing(self._identity, self._store, session.sub, now)).allowed:
            raise LinkProblem(403, "Account not allowed", "This account may not link a chat account.")
        return session

    async def start(self, session: BrowserSession, now: int) -> str:
        """Remember a new attempt; returns the provider's authorize URL to redirect to."""
        state = new_token()
        params = {"sub": session.sub, "session": session.session_hash}
        challenge = None
        if self._pkce:
            params["verifier"] = new_token()
            challenge = pkce.s256(params["verifier"])
        await self._store.save_pending(PendingAuthorization(
            request_id=token_hash(state), client_id=LINK_CLIENT_ID, params=params, csrf_token="",
            created_at=now, expires_at=now + LINK_TTL,
        ))
        return self._provider.authorize_url(state, challenge, self.redirect_uri)

    async def _take_attempt(self, session: BrowserSession, state: str | None, now: int) -> PendingAuthorization:
        """The attempt C{state} names, started in this session; consumed so it works once."""
        if state is None:
            raise LinkProblem(
                400, "Link not completed", "The chat platform sent you back without the link attempt's state."
            )
        pending = await self._store.get_pending(token_hash(state), now)
        if (
            pending is None
            or pending.client_id != LINK_CLIENT_ID
            or not hmac.compare_digest(pending.params.get("session", "").encode(), session.session_hash.encode())
            or pending.params.get("sub") != session.sub
            or not await self._store.delete_pending(pending.request_id)
        ):
            raise LinkProblem(
                400, "Link not completed",
                "This link attempt has expired, was already used, or was started in another browser. Start again.",
            )
        return pending

    async def finish(self, session: BrowserSession, params: dict[str, str], now: int) -> LinkedAccount:
        """
        The provider's redirect back: check the attempt, exchange the code,
        ask who the user is there, and store the link (replacing an earlier one).
        """
        error = params.get("error")
        if error is not None:
            try:
                await self._take_attempt(session, params.get("state"), now)
            except LinkProblem:
                pass
            if error == "access_denied":
                raise LinkProblem(200, "Linking cancelled", "Linking was cancelled: no chat account was linked.")
            raise LinkProblem(
                502, "Linking cancelled",
                "The chat platform reported a problem, so linking was cancelled. Try again later.",
            )
        pending = await self._take_attempt(session, params.get("state"), now)
        code = params.get("code")
        if code is None:
            raise LinkProblem(400, "Link not completed", "The chat platform sent you back without a code. Start again.")
        try:
            tokens = await self._provider.exchange_code(code, pending.params.get("verifier"), self.redirect_uri)
            provider_user_id = await self._provider.current_user(tokens.access_token)
        except ChatCodeRejected:
            raise LinkProblem(
                400, "Link not completed", "The chat platform did not accept the link. Start again."
            ) from None
        except ChatProviderUnavailable:
            raise LinkProblem(
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
        await self._store.link_account(account)
        events.chat_linked(
            sub=session.sub, provider=self.provider_name, account_id=account_id, provider_user_id=provider_user_id
        )
        return account

    async def unlink(self, session: BrowserSession) -> bool:
        """Remove the user's link; True when there was one."""
        removed = await self._store.unlink_account(session.sub, self.provider_name)
        if removed:
            events.chat_unlinked(sub=session.sub, provider=self.provider_name)
        return removed
