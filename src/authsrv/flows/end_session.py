"""
RP-initiated logout (OIDC RP-Initiated Logout 1.0): the end-session
endpoint. The hint must be an ID token this server signed for a client with
end-session enabled, and a post-logout redirect URI must be registered,
else the user sees an error page, never a redirect. The browser session
ends, the clients it signed in to hear of it by back-channel without the
user waiting, and the browser goes back to the client or sees a notice.
"""

from __future__ import annotations

from authsrv.flows.outcomes import Browser, CookieChanges, Notice, Redirect
from authsrv.protocol.errors import InvalidRequest
from authsrv.protocol.logout import hint_audience, hint_claims, post_logout_location, refused
from authsrv.protocol.params import single_params
from authsrv.records import Client

SIGNED_OUT = CookieChanges(end_session=True)


class EndSessionFlow:
    """C{sessions} is an L{authsrv.flows.sessions.SessionEnder}."""

    def __init__(self, *, store, keystore, issuer: str, sessions):
        self._store = store
        self._keystore = keystore
        self._issuer = issuer
        self._sessions = sessions

    async def end(self, args: dict[bytes, list[bytes]], browser: Browser) -> Redirect | Notice:
        client, location = await self._check(args)
        await self._sessions.end(browser.session, f"end-session from {client.client_id}")
        if location is not None:
            return Redirect(location, 302, SIGNED_OUT)
        return Notice(200, "You are signed out", "Your session here has ended. You can close this page.",
                      SIGNED_OUT)

    async def _check(self, args) -> tuple[Client, str | None]:
        """The client the hint names and where the browser goes next (None: our page)."""
        try:
            params = single_params(args)
        except InvalidRequest as e:
            raise refused(e.description) from None
        hint = params.get("id_token_hint")
        if hint is None:
            raise refused("The sign-out request must carry id_token_hint.")
        claims = hint_claims(hint, self._keystore.public_keyset(), self._keystore.algorithms, self._issuer)
        client_id = hint_audience(claims)
        if params.get("client_id", client_id) != client_id:
            raise refused("The client_id does not match the client the ID token was issued to.")
        client = await self._store.get_client(client_id)
        if client is None or not client.end_session_enabled:
            raise refused("This application may not sign users out here.")
        uri = params.get("post_logout_redirect_uri")
        if uri is not None and uri not in client.post_logout_redirect_uris:
            raise refused("The post_logout_redirect_uri is not registered for this application.")
        return client, None if uri is None else post_logout_location(uri, params.get("state"))
