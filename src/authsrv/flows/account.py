"""
A signed-in user's own second factors at the service: set up (or replace)
a TOTP authenticator and get a new set of recovery codes. Forms carry a
CSRF token bound to the session cookie (L{session_form_token}), so only a
page rendered for this browser can post them. Once a user has a factor,
changing factors needs a session that gave one: a stolen password alone
never replaces an authenticator.
"""

from __future__ import annotations

from authsrv.flows.csrf import session_form_token, session_form_token_valid
from authsrv.flows.mfa import SecondFactors
from authsrv.flows.outcomes import EnrolmentForm, Notice, RecoveryCodes
from authsrv.flows.sessions import live_session
from authsrv.protocol.errors import PageError
from authsrv.records import ACR_MFA, BrowserSession

TOTP_PURPOSE = b"account mfa totp"
RECOVERY_PURPOSE = b"account mfa recovery"
WRONG_FIRST_CODE = "That code does not match; check the time on your phone and try the current code."


def recovery_form_token(cookie: str) -> str:
    """The CSRF token of the form that asks for new recovery codes."""
    return session_form_token(cookie, RECOVERY_PURPOSE)


class AccountFactors:
    """C{factors} is the server's L{SecondFactors}; C{identity} names users."""

    def __init__(self, *, store, identity, factors: SecondFactors):
        self._store = store
        self._identity = identity
        self._factors = factors

    async def _session(self, cookie: str | None, now: int) -> tuple[str, BrowserSession]:
        """The signed-in browser's cookie and session, or a page saying what is missing."""
        if not self._factors.policy.enabled:
            raise PageError(404, "Not available", "This service does not use second factors.")
        session = await live_session(self._store, self._identity, cookie, now)
        if cookie is None or session is None:
            raise PageError(401, "Not signed in", "Sign in to an application first, then come back to this page.")
        if session.acr != ACR_MFA and await self._factors.has_totp(session.sub):
            raise PageError(403, "Confirm it is you",
                            "Sign in again with your second factor before changing your factors.")
        return cookie, session

    async def totp_form(self, cookie: str | None, now: int) -> EnrolmentForm:
        cookie, session = await self._session(cookie, now)
        return await self._form(cookie, session, None, None, now)

    async def submit_totp(self, cookie: str | None, form: dict[str, str] | None, now: int) -> EnrolmentForm | Notice:
        """Confirm the authenticator shown with its first code; the earlier one and its recovery codes go."""
        cookie, session = await self._session(cookie, now)
        form = form or {}
        if not session_form_token_valid(cookie, TOTP_PURPOSE, form.get("csrf")):
            raise PageError(403, "Not changed", "This form has expired. Reload the page and try again.")
        if not await self._factors.confirm(session.sub, form.get("sealed"), form.get("code", ""), now):
            return await self._form(cookie, session, form.get("sealed"), WRONG_FIRST_CODE, now)
        return Notice(200, "Authenticator set up",
                      "From now on, signing in asks for a code from your authenticator app after your password.")

    async def replace_recovery_codes(self, cookie: str | None, form: dict[str, str] | None, now: int) -> RecoveryCodes:
        """A new set of recovery codes for a user with an authenticator; the old ones stop working."""
        cookie, session = await self._session(cookie, now)
        if not session_form_token_valid(cookie, RECOVERY_PURPOSE, (form or {}).get("csrf")):
            raise PageError(403, "Not changed", "This form has expired. Reload the page and try again.")
        if not await self._factors.has_totp(session.sub):
            raise PageError(409, "No authenticator", "Set up an authenticator first; it comes with recovery codes.")
        return RecoveryCodes(await self._factors.replace_recovery_codes(session.sub, now))

    async def _form(self, cookie: str, session: BrowserSession, sealed: str | None, message: str | None,
                    now: int) -> EnrolmentForm:
        user = await self._identity.user_by_id(session.sub)
        login = user.login if user else session.sub
        enrolment = await self._factors.open_enrolment(session.sub, sealed, login, now)
        if enrolment is None:
            enrolment = await self._factors.new_enrolment(session.sub, login, now)
        return EnrolmentForm(
            status=200, user_label=login, secret=enrolment.secret, otpauth_uri=enrolment.otpauth_uri,
            recovery_codes=enrolment.recovery_codes, sealed=enrolment.sealed,
            fields=(("csrf", session_form_token(cookie, TOTP_PURPOSE)),),
            recovery_csrf=recovery_form_token(cookie) if await self._factors.has_totp(session.sub) else None,
            message=message,
        )
