"""
RP-initiated logout (OIDC RP-Initiated Logout 1.0): the end-session
endpoint. The hint must be an ID token this server signed for a client with
end-session enabled, and a post-logout redirect URI must be registered,
else the user sees an error page, never a redirect. The browser session
ends only when the hint names it (its sub, and its sid when present): any
ID token of ours could be replayed by another site (logout CSRF), so for
any other session the user is asked first, with a form bound to the
session. The clients the session signed in to hear of its end by
back-channel without the user waiting, and the browser goes back to the
client or sees a notice. A form the client posts from its own site comes
without the session cookie (SameSite=Lax): it is sent back as a GET, which
carries it, rather than redirected to the client with the session alive.
"""

from __future__ import annotations

from authsrv.flows.csrf import session_form_token, session_form_token_valid
from authsrv.flows.outcomes import Browser, CookieChanges, LogoutConfirmation, Notice, Redirect
from authsrv.protocol.errors import InvalidRequest
from authsrv.protocol.logout import hint_audience, hint_claims, post_logout_location, refused
from authsrv.protocol.params import page_params
from authsrv.protocol.urls import origin, with_query
from authsrv.records import BrowserSession, Client
from authsrv.tokens import token_hash

SIGNED_OUT = CookieChanges(end_session=True)


CONFIRM_PURPOSE = b"authsrv end-session"
KEPT = ("id_token_hint", "client_id", "post_logout_redirect_uri", "state")
"""The request's parameters that a confirmation, or the request made again as a GET, carries on."""


def _names(claims: dict, session: BrowserSession) -> bool:
    """Whether the hint is about this session: same user, and same session when it says which."""
    return claims["sub"] == session.sub and claims.get("sid", session.sid) == session.sid


class EndSessionFlow:
    """C{sessions} is an L{authsrv.flows.sessions.SessionEnder}."""

    def __init__(self, *, store, keystore, issuer: str, sessions):
        self._store = store
        self._keystore = keystore
        self._issuer = issuer
        self._endpoint = f"{issuer}/oauth2/end-session"
        self._sessions = sessions

    async def end(self, args: dict[bytes, list[bytes]], browser: Browser, now: int,
                  posted: bool, address: str) -> Redirect | Notice | LogoutConfirmation:
        """RP-initiated logout from the browser at C{address}, which the session's audit event names."""
        params = self._params(args)
        client, location, claims = await self._check(params)
        if posted and not browser.session:
            # A form posted from the client's site: SameSite=Lax kept the session cookie away, so the
            # session is unknown here. The same request as a GET, a top-level navigation, carries it.
            return Redirect(with_query(self._endpoint, {name: params[name] for name in KEPT if name in params}), 303)
        session = await self._store.get_session(token_hash(browser.session), now) if browser.session else None
        confirmed = posted and params.get("confirm") == "yes" and session_form_token_valid(
            browser.session, CONFIRM_PURPOSE, params.get("csrf")
        )
        if session is not None and not confirmed and not _names(claims, session):
            return LogoutConfirmation(
                client_name=client.name or client.client_id,
                fields=tuple((name, params[name]) for name in KEPT if name in params),
                csrf=session_form_token(browser.session or "", CONFIRM_PURPOSE),
                client_origin=None if location is None else origin(location),
            )
        await self._sessions.end(browser.session, f"end-session from {client.client_id}", address)
        if location is not None:
            return Redirect(location, 302, SIGNED_OUT)
        return Notice(200, "You are signed out", "Your session here has ended. You can close this page.",
                      SIGNED_OUT)

    @staticmethod
    def _params(args) -> dict[str, str]:
        try:
            return page_params(args)
        except InvalidRequest as e:
            raise refused(e.description) from None

    async def _check(self, params: dict[str, str]) -> tuple[Client, str | None, dict]:
        """The client the hint names, where the browser goes next (None: our page), and the hint's claims."""
        hint = params.get("id_token_hint")
        if hint is None:
            raise refused("The sign-out request must carry id_token_hint.")
        claims = hint_claims(hint, self._keystore.hint_key, self._issuer)
        client_id = hint_audience(claims)
        if params.get("client_id", client_id) != client_id:
            raise refused("The client_id does not match the client the ID token was issued to.")
        client = await self._store.get_client(client_id)
        if client is None or not client.end_session_enabled:
            raise refused("This application may not sign users out here.")
        uri = params.get("post_logout_redirect_uri")
        if uri is not None and uri not in client.post_logout_redirect_uris:
            raise refused("The post_logout_redirect_uri is not registered for this application.")
        return client, None if uri is None else post_logout_location(uri, params.get("state")), claims
