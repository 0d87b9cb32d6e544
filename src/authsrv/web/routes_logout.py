"""
The end-session endpoint (OIDC RP-Initiated Logout 1.0): a browser page,
so every refusal is an HTML error page, never JSON and never a redirect.
"""

from __future__ import annotations

from twisted.web.template import tags

from authsrv.config import ISSUER_PATH
from authsrv.flows.end_session import LogoutRefused, check_request
from authsrv.flows.sessions import end_browser_session
from authsrv.protocol.errors import InvalidRequest
from authsrv.protocol.params import single_params
from authsrv.web.cookies import SESSION_COOKIE
from authsrv.web.pages import error_page, render_page
from authsrv.web.routing import app


@app.route(ISSUER_PATH + "/oauth2/end-session", methods=["GET", "POST"], endpoint="logout.end_session")
async def end_session(server, request):
    """
    End the browser's session, start the back-channel notices without
    waiting for them, then send the browser back to the client or show that
    the user is signed out.
    """
    try:
        logout = await check_request(server.store, server.keystore, server.issuer, single_params(request.args))
    except InvalidRequest as e:
        return error_page(request, 400, "Sign-out failed", e.description)
    except LogoutRefused as e:
        return error_page(request, 400, "Sign-out failed", e.message)
    session = await end_browser_session(
        server.store, server.cookies.get(request, SESSION_COOKIE), f"end-session from {logout.client.client_id}"
    )
    server.cookies.clear(request, SESSION_COOKIE)
    if session is not None:
        server.backchannel.session_ended(server.store, server.keystore, server.issuer, session)
    if logout.location is not None:
        request.setResponseCode(302)
        request.setHeader(b"location", logout.location.encode())
        request.setHeader(b"cache-control", b"no-store")
        return b""
    return render_page(
        request, 200, "You are signed out", tags.p("Your session here has ended. You can close this page.")
    )
