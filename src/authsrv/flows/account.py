"""
A signed-in user's own account at the service: the account page (sessions,
connected applications, the chat link, factors, password) and their second
factors: set up (or replace) a TOTP authenticator, get a new set of
recovery codes, add and remove passkeys. Forms carry a
CSRF token bound to the session cookie (L{session_form_token}), so only a
page rendered for this browser can post them. Changing factors needs a
recent sign-in (C{[mfa] recent_sign_in}) and, once a user has a factor, a
session that gave one: neither a stolen session cookie nor a stolen
password alone enrols or replaces one. A session that may not is sent to
sign in again and comes back to the page it was on; a browser without a
session that opens a page is sent to sign in first, as an account console
does, and comes back to it; a form posted without one is refused, as it has
nothing to act on.
"""

from __future__ import annotations

from typing import Callable

from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from authsrv import events
from authsrv.flows.csrf import session_form_token, session_form_token_valid
from authsrv.flows.mfa import SecondFactors
from authsrv.flows.interaction import WRONG_FIRST_CODE, InteractionFlow, impossible_message
from authsrv.flows.outcomes import Browser, EnrolmentForm, NewRecoveryCodes, RecoveryCodes, Redirect
from authsrv.flows.link import unlink_token
from authsrv.flows.login import LoggedIn, Throttled, Unavailable
from authsrv.flows.passkeys import PASSKEY_METHODS, Passkeys, TooManyPasskeys
from authsrv.identity.credentials import MAX_PASSWORD_BYTES
from authsrv.identity.errors import BackendUnavailable, UnknownUser
from authsrv.interfaces import IIdentityBackend, IUserManagement
from authsrv.protocol.errors import PageError
from authsrv.protocol.password_policy import MIN_LENGTH, password_problem
from authsrv.records import ACR_MFA, RECOVERY_FACTOR, TOTP_FACTOR, BrowserSession, Passkey

TOTP_PURPOSE = b"account mfa totp"
TOTP_SET_UP = "totp-set-up"
"""L{AccountFactors.submit_totp}'s answer once the new authenticator is confirmed (a key of L{NOTICES})."""
RECOVERY_PURPOSE = b"account mfa recovery"

log = Logger()


def not_signed_in() -> PageError:
    """A form posted without a live session (its page, opened again, signs the browser in)."""
    return PageError(401, "Not signed in", "You are not signed in, or your session has ended. Open your account page"
                     " to sign in, then try again.")


def strong_session(session: BrowserSession) -> bool:
    """A session that gave a second factor, or signed in with a passkey (which verified its user)."""
    return session.acr == ACR_MFA or any(method in PASSKEY_METHODS for method in session.amr)


async def fit_to_change(factors: SecondFactors, session: BrowserSession, now: int) -> bool:
    """
    Whether the session may change the user's factors: it signed in within
    C{[mfa] recent_sign_in}, with a second factor (or a passkey) once the
    user has one.
    """
    if not factors.recent(session, now):
        return False
    return strong_session(session) or not await factors.has_factor(session.sub)


async def sign_in_unless_fit(factors: SecondFactors, interaction: InteractionFlow, return_to: str,
                             session: BrowserSession, browser: Browser, address: str, now: int) -> Redirect | None:
    """None when the session may change factors, else the fresh sign-in that comes back to C{return_to}."""
    if await fit_to_change(factors, session, now):
        return None
    return await interaction.sign_in_again(return_to, session.sub, browser, address, now)


def recovery_form_token(cookie: str) -> str:
    """The CSRF token of the form that asks for new recovery codes."""
    return session_form_token(cookie, RECOVERY_PURPOSE)


class AccountFactors:
    """
    C{factors} is the server's L{SecondFactors}; C{identity} names users;
    C{interaction} signs a user in again (L{sign_in_unless_fit}), back to
    the TOTP page under C{issuer}.
    """

    def __init__(self, *, store, identity, factors: SecondFactors, interaction: InteractionFlow, issuer: str):
        self._store = store
        self._identity = identity
        self._factors = factors
        self._interaction = interaction
        self._page = f"{issuer}/account/mfa/totp"

    async def _live(self, cookie: str | None, now: int) -> BrowserSession | None:
        """The browser's live session or None; a page saying so when the service has no second factors."""
        if not self._factors.policy.enabled:
            raise PageError(404, "Not available", "This service does not use second factors.")
        return await self._interaction.live_session(cookie, now)

    async def _session(self, cookie: str | None, now: int) -> tuple[str, BrowserSession]:
        """The signed-in browser's cookie and session, or a page saying what is missing."""
        session = await self._live(cookie, now)
        if cookie is None or session is None:
            raise not_signed_in()
        return cookie, session

    async def _unfit(self, session: BrowserSession, browser: Browser, address: str, now: int) -> Redirect | None:
        return await sign_in_unless_fit(self._factors, self._interaction, self._page, session, browser, address,
                                        now)

    async def totp_form(self, browser: Browser, address: str, now: int,
                        shown: str | None = None) -> EnrolmentForm | Redirect:
        """
        The authenticator page, with the enrolment it C{shown} before (sealed)
        while it lasts; a browser without a session signs in first and comes
        back to it.
        """
        cookie = browser.session
        session = await self._live(cookie, now)
        if cookie is None or session is None:
            return await self._interaction.sign_in_again(self._page, None, browser, address, now)
        if again := await self._unfit(session, browser, address, now):
            return again
        return await self._form(cookie, session, shown, None, now)

    async def submit_totp(self, browser: Browser, form: dict[str, str] | None, address: str,
                          now: int) -> EnrolmentForm | str | Redirect:
        """
        Confirm the authenticator shown with its first code; the earlier one
        and its recovery codes go. Done, the answer is its key of L{NOTICES}.
        """
        cookie, session = await self._session(browser.session, now)
        form = form or {}
        if not session_form_token_valid(cookie, TOTP_PURPOSE, form.get("csrf")):
            raise PageError(403, "Not changed", "This form has expired. Reload the page and try again.")
        if again := await self._unfit(session, browser, address, now):
            return again
        if not await self._factors.confirm(session.sub, form.get("sealed"), form.get("code", ""), now, address):
            return await self._form(cookie, session, form.get("sealed"), WRONG_FIRST_CODE, now)
        return TOTP_SET_UP

    async def replace_recovery_codes(self, browser: Browser, form: dict[str, str] | None, address: str,
                                     now: int) -> NewRecoveryCodes | Redirect:
        """A new set of recovery codes for a user with an authenticator; the old ones stop working."""
        cookie, session = await self._session(browser.session, now)
        if not session_form_token_valid(cookie, RECOVERY_PURPOSE, (form or {}).get("csrf")):
            raise PageError(403, "Not changed", "This form has expired. Reload the page and try again.")
        if again := await self._unfit(session, browser, address, now):
            return again
        if not await self._factors.has_totp(session.sub):
            raise PageError(409, "No authenticator", "Set up an authenticator first; it comes with recovery codes.")
        return NewRecoveryCodes(await self._factors.replace_recovery_codes(session.sub, now, address))

    async def new_recovery_codes(self, browser: Browser, sealed: str | None, now: int) -> RecoveryCodes:
        """
        The codes a L{NewRecoveryCodes} sealed, to show this once; none once
        shown (the browser keeps them for one showing), with the form that
        asks for another set.
        """
        cookie, session = await self._session(browser.session, now)
        return RecoveryCodes(await self._factors.open_new_recovery_codes(session.sub, sealed, now),
                             recovery_form_token(cookie))

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


ACCOUNT_PURPOSE = b"account page"
PASSKEY_PURPOSE = b"account passkeys"
EXPIRED_FORM = "This form has expired. Reload the page and try again."


def full_of_passkeys(limit: int) -> str:
    """What the page says when the user keeps C{limit} passkeys, the most they may."""
    return f"You have {limit} passkeys, the most an account keeps. Remove one to add another."


class PasswordRefused(str):
    """
    The password form's answer when it changed nothing: the page shows it
    as an error next to that form, not as news at the top of the page.
    """


WRONG_CURRENT_PASSWORD = "current-password-wrong"
PASSWORD_NOT_CHECKED = "password-not-checked"
PASSWORD_THROTTLED = "password-throttled"
PASSWORD_NOT_HASHED = "password-not-changed"
NOTICES: dict[str, str] = {
    "session-ended": "That session is signed out.",
    "session-gone": "That session had ended already.",
    "app-revoked": "The application's access is revoked; it will ask again next time.",
    "app-gone": "That application had no access.",
    "password-changed": "Your password is changed; your other sessions are signed out.",
    WRONG_CURRENT_PASSWORD: PasswordRefused("Your current password is not right."),
    PASSWORD_NOT_CHECKED: PasswordRefused("Your current password could not be checked just now, so your password is"
                                          " not changed. Try again in a moment."),
    PASSWORD_THROTTLED: PasswordRefused("Too many password attempts just now, so your password is not changed."
                                        " Wait a few minutes and try again."),
    PASSWORD_NOT_HASHED: PasswordRefused("Your password could not be changed just now; your current one still works."
                                         " Try again in a moment."),
    "passkey-added": "Your passkey is added.",
    "passkey-not-added": "The passkey could not be added. Try again.",
    "passkey-removed": "The passkey is removed.",
    "passkey-gone": "That passkey was removed already.",
    TOTP_SET_UP: "Authenticator set up: from now on, signing in asks for a code from your authenticator app"
                   " after your password.",
    "chat-unlinked": "Your chat account is no longer linked.",
    "chat-gone": "No chat account was linked.",
}
"""
What a posted form did, by the key it answers (the account page is then
opened with C{?done=KEY}, so a reload sends nothing again): the page shows
only these fixed texts, never words from its URL, and ignores other keys.
"""


@frozen
class SessionRow:
    """One of the user's signed-in browsers, as the account page lists it."""

    sid: str
    device: str
    address: str | None
    signed_in: int
    last_seen: int
    current: bool


@frozen
class AppRow:
    """An application the user signed in to or consented to: its live grants and remembered scopes."""

    client_id: str
    name: str
    scope: tuple[str, ...]
    since: int
    grants: int


@frozen
class AccountView:
    """
    Everything the account page shows; C{csrf} signs its forms, C{passkey_csrf}
    the passkey forms (None when the session may not change factors), and
    C{passkey_options} are the WebAuthn creation options of a new passkey
    (None too when the user keeps the most passkeys they may already:
    C{passkeys_full} says so).
    """

    user_label: str
    sessions: tuple[SessionRow, ...]
    apps: tuple[AppRow, ...]
    chat_provider: str | None
    chat_account: str | None
    chat_unlink_csrf: str | None
    factors_enabled: bool
    totp: bool
    recovery_left: int | None
    passkeys: tuple[Passkey, ...]
    can_change_password: bool
    csrf: str
    passkey_csrf: str | None = None
    passkey_options: str | None = None
    passkeys_full: str | None = None
    message: str | None = None


def device_of(user_agent: str | None) -> str:
    """A short name of the browser and system a User-Agent names (enough to tell one's own devices apart)."""
    if not user_agent:
        return "Unknown device"
    browser = next((name for token, name in _BROWSERS if token in user_agent), "Browser")
    system = next((name for token, name in _SYSTEMS if token in user_agent), "unknown system")
    return f"{browser} on {system}"


_BROWSERS = (("Edg/", "Edge"), ("OPR/", "Opera"), ("Firefox/", "Firefox"), ("Chrome/", "Chrome"),
             ("Chromium/", "Chromium"), ("Safari/", "Safari"), ("curl/", "curl"))
_SYSTEMS = (("Android", "Android"), ("iPhone", "iPhone"), ("iPad", "iPad"), ("Windows", "Windows"),
            ("Mac OS X", "macOS"), ("CrOS", "ChromeOS"), ("Linux", "Linux"))


def _unhashed(failure: Failure, sub: str) -> None:
    """
    A new hash the password pool failed to make (argon2 out of memory, say):
    logged by its kind only, and None, so the change is the page's refusal
    with the password kept, not a 500 after the current one was right.
    """
    log.error("the new password hash of {sub} could not be made: {error}", sub=sub,
              error=type(failure.value).__name__)
    return None


class AccountPage:
    """
    The signed-in user's own account at the service: sessions, connected
    applications, the linked chat account, factors and password. C{sessions}
    is the L{SessionEnder} (back-channel logout for every session ended),
    C{login} the L{authsrv.flows.login.PasswordLogin} that checks the
    current password (throttled as at sign-in), C{linking} the chat link
    flow or None, C{passkeys} the L{Passkeys} or None when factors are off;
    C{interaction} signs a user in again (L{sign_in_unless_fit}), back to
    the account page under C{issuer}; C{hash_password(password)} fires
    with a new password's hash, made on the password pool
    (L{authsrv.identity.passwords.new_hashes}).
    """

    def __init__(self, *, store, identity, clients, sessions, login, factors: SecondFactors,
                 passkeys: Passkeys | None, linking, interaction: InteractionFlow, issuer: str,
                 hash_password: Callable[[str], Deferred], min_length: int = MIN_LENGTH):
        self._interaction = interaction
        self._page = f"{issuer}/account"
        self._min_length = min_length
        self._hash = hash_password
        self._store = store
        self._identity = identity
        self._clients = clients
        self._sessions = sessions
        self._login = login
        self._factors = factors
        self._passkeys = passkeys
        self._linking = linking

    async def _signed_in(self, cookie: str | None, now: int) -> tuple[str, BrowserSession]:
        session = await self._interaction.live_session(cookie, now)
        if cookie is None or session is None:
            raise not_signed_in()
        return cookie, session

    async def _posted(self, cookie: str | None, form: dict[str, str] | None, purpose: bytes,
                      now: int) -> tuple[str, BrowserSession, dict[str, str]]:
        cookie, session = await self._signed_in(cookie, now)
        form = form or {}
        if not session_form_token_valid(cookie, purpose, form.get("csrf")):
            raise PageError(403, "Not changed", EXPIRED_FORM)
        return cookie, session, form

    async def _user_manager(self, sub: str):
        """The identity backend that knows the user and can write their password, or None."""
        for backend in getattr(self._identity, "backends", (self._identity,)):
            if not IUserManagement.providedBy(backend):
                continue
            try:
                if await IIdentityBackend(backend).user_by_id(sub) is not None:
                    return backend
            except (UnknownUser, BackendUnavailable):
                continue
        return None

    async def page(self, browser: Browser, address: str, now: int, done: str | None = None) -> AccountView | Redirect:
        """
        The page for a signed-in browser, saying what the form it comes
        from did (C{done}, a key of L{NOTICES}); any other browser is sent
        to sign in and comes back here.
        """
        cookie = browser.session
        session = await self._interaction.live_session(cookie, now)
        if cookie is None or session is None:
            return await self._interaction.sign_in_again(self._page, None, browser, address, now)
        notice: str | None = NOTICES.get(done or "")
        if done == "passkey-limit" and self._passkeys is not None:
            notice = full_of_passkeys(self._passkeys.limit)
        return await self._view(cookie, session, now, notice)

    async def view(self, cookie: str | None, now: int, message: str | None = None) -> AccountView:
        """The page answering a refused password change, with its C{message}."""
        cookie, session = await self._signed_in(cookie, now)
        return await self._view(cookie, session, now, message)

    async def _view(self, cookie: str, session: BrowserSession, now: int, message: str | None = None) -> AccountView:
        sub = session.sub
        user = await self._identity.user_by_id(sub)
        sessions = tuple(
            SessionRow(s.sid, device_of(s.user_agent), s.address, s.auth_time, s.last_seen or s.created_at,
                       s.session_hash == session.session_hash)
            for s in await self._store.list_user_sessions(sub, now)
        )
        chat_provider = chat_account = None
        if self._linking is not None:
            chat_provider = self._linking.provider_name
            linked = await self._store.get_linked_account(sub, chat_provider)
            chat_account = linked.provider_user_id if linked else None
        factors = {factor.kind: factor for factor in await self._factors.factors(sub)}
        recovery = factors.get(RECOVERY_FACTOR)
        enabled = self._passkeys is not None
        may_change = enabled and await fit_to_change(self._factors, session, now)
        passkeys = tuple(await self._passkeys.list(sub)) if self._passkeys else ()
        full = self._passkeys is not None and len(passkeys) >= self._passkeys.limit
        return AccountView(
            user_label=user.login if user else sub,
            sessions=sessions,
            apps=await self._apps(sub, now),
            chat_provider=chat_provider,
            chat_account=chat_account,
            chat_unlink_csrf=unlink_token(cookie) if chat_account else None,
            factors_enabled=enabled,
            totp=TOTP_FACTOR in factors,
            recovery_left=recovery.remaining if recovery else None,
            passkeys=passkeys,
            can_change_password=await self._user_manager(sub) is not None,
            csrf=session_form_token(cookie, ACCOUNT_PURPOSE),
            passkey_csrf=session_form_token(cookie, PASSKEY_PURPOSE) if may_change else None,
            passkey_options=await self._passkeys.registration_options(
                sub, user.login if user else sub, (user.name or user.login) if user else sub, now,
            ) if may_change and self._passkeys and not full else None,
            passkeys_full=full_of_passkeys(self._passkeys.limit) if self._passkeys and full else None,
            message=message,
        )

    async def _apps(self, sub: str, now: int) -> tuple[AppRow, ...]:
        grants: dict[str, list] = {}
        for grant in await self._store.list_user_grants(sub, now):
            grants.setdefault(grant.client_id, []).append(grant)
        consents = {consent.client_id: consent for consent in await self._store.list_user_consents(sub)}
        rows = []
        for client_id in sorted(set(grants) | set(consents)):
            client = await self._clients.get_client(client_id)
            consent = consents.get(client_id)
            scope = set(consent.scope) if consent else set()
            for grant in grants.get(client_id, ()):
                scope.update(grant.scope)
            since = min([g.created_at for g in grants.get(client_id, ())] + ([consent.created_at] if consent else []))
            rows.append(AppRow(client_id, (client.name if client else "") or client_id, tuple(sorted(scope)),
                               since, len(grants.get(client_id, ()))))
        return tuple(rows)

    async def end_session(self, cookie: str | None, form: dict[str, str] | None, address: str, now: int) -> str:
        """
        Sign out one of the user's other sessions (its clients hear by
        back-channel logout); audited with this browser's C{address}.
        """
        _, session, form = await self._posted(cookie, form, ACCOUNT_PURPOSE, now)
        target = next((s for s in await self._store.list_user_sessions(session.sub, now)
                       if s.sid == form.get("sid")), None)
        if target is None or target.session_hash == session.session_hash:
            return "session-gone"
        await self._sessions.end_session(target, "signed out from the account page", address)
        events.account_session_ended(sub=session.sub, session_id=target.sid, address=address)
        return "session-ended"

    async def revoke_app(self, cookie: str | None, form: dict[str, str] | None, address: str, now: int) -> str:
        """
        Withdraw an application's access: every grant of the user to it is
        revoked (its tokens die) and the remembered consent forgotten, so
        its next request asks again; audited with this browser's C{address}.
        """
        _, session, form = await self._posted(cookie, form, ACCOUNT_PURPOSE, now)
        client_id = form.get("client_id", "")
        revoked = 0
        for grant in await self._store.list_user_grants(session.sub, now):
            if grant.client_id == client_id and await self._store.revoke_grant(grant.grant_id, now):
                revoked += 1
        forgot = await self._store.revoke_consent(session.sub, client_id)
        if not revoked and not forgot:
            return "app-gone"
        events.account_app_revoked(sub=session.sub, client_id=client_id, grants=revoked, address=address)
        return "app-revoked"

    async def change_password(self, cookie: str | None, form: dict[str, str] | None, address: str,
                              device: str | None, now: int) -> str | PasswordRefused:
        """
        A new password for a user of a backend that can write: the current
        one is checked (and counted) as at sign-in, its new hash made within
        that check's admission (so a flood of changes is refused as one of
        sign-ins is, C{[throttle] checks_in_flight}), and every other session
        of the user ends. The answer is a key of L{NOTICES}, or the
        refusal of new passwords that are different or against the policy
        (checked first, counted nowhere, so that form may be sent again).
        """
        _, session, form = await self._posted(cookie, form, ACCOUNT_PURPOSE, now)
        sub = session.sub
        manager = await self._user_manager(sub)
        user = await self._identity.user_by_id(sub)
        if manager is None or user is None:
            raise PageError(404, "Not available", "Your password is managed elsewhere.")
        current, new = form.get("current_password", ""), form.get("new_password", "")
        again = form.get("new_password_again", "")
        for field, value in (("current password", current), ("new password", new)):
            if impossible := impossible_message(value, field, MAX_PASSWORD_BYTES, "password"):
                events.password_change_refused(sub=sub, address=address, reason=f"{field} no one can have")
                return PasswordRefused(impossible)
        if not new or new != again:
            events.password_change_refused(sub=sub, address=address, reason="new passwords missing or different")
            return PasswordRefused("The two new passwords are not the same.")
        problem = password_problem(new, login=user.login, email=user.email, min_length=self._min_length)
        if problem:
            events.password_change_refused(sub=sub, address=address, reason="new password against the policy")
            return PasswordRefused(problem)
        checked = await self._login.log_in(user.login, current, address, device, now,
                                           along=lambda: self._hash(new).addErrback(_unhashed, sub))
        if isinstance(checked, Unavailable):
            events.password_change_refused(sub=sub, address=address, reason="current password not checkable")
            return PASSWORD_NOT_CHECKED
        if isinstance(checked, Throttled):
            events.password_change_refused(sub=sub, address=address, reason="too many password attempts")
            return PASSWORD_THROTTLED
        if not isinstance(checked, LoggedIn) or checked.user.sub != sub:
            events.password_change_refused(sub=sub, address=address, reason="current password not accepted")
            return WRONG_CURRENT_PASSWORD
        if checked.along is None:
            events.password_change_refused(sub=sub, address=address, reason="new password not hashed")
            return PASSWORD_NOT_HASHED
        try:
            await manager.set_password_hash(user.login, checked.along)
        except ValueError:
            events.password_change_refused(sub=sub, address=address, reason="user removed meanwhile")
            raise not_signed_in() from None
        ended = 0
        for other in await self._store.list_user_sessions(sub, now):
            if other.session_hash != session.session_hash:
                ended += await self._sessions.end_session(other, "password changed", address)
        events.password_changed(sub=sub, sessions_ended=ended, address=address)
        return "password-changed"

    async def sign_in_again(self, browser: Browser, address: str, now: int) -> Redirect:
        """
        The fresh sign-in that lets this browser change factors (its user's
        login filled in), or that a browser without a session starts with
        an empty form; back to the account page either way.
        """
        session = await self._interaction.live_session(browser.session, now)
        return await self._interaction.sign_in_again(self._page, session.sub if session else None, browser,
                                                     address, now)

    async def register_passkey(self, browser: Browser, form: dict[str, str] | None, address: str,
                               now: int) -> str | Redirect:
        """Keep the passkey the browser just created for this page's challenge."""
        _, session, form = await self._posted(browser.session, form, PASSKEY_PURPOSE, now)
        if again := await self._unfit(session, browser, address, now):
            return again
        assert self._passkeys is not None, "_unfit refuses without passkeys"
        added = await self._passkeys.register(session.sub, form.get("credential"), now, address)
        if added is None:
            return "passkey-not-added"
        if isinstance(added, TooManyPasskeys):
            return "passkey-limit"
        return "passkey-added"

    async def remove_passkey(self, browser: Browser, form: dict[str, str] | None, address: str,
                             now: int) -> str | Redirect:
        _, session, form = await self._posted(browser.session, form, PASSKEY_PURPOSE, now)
        if again := await self._unfit(session, browser, address, now):
            return again
        assert self._passkeys is not None, "_unfit refuses without passkeys"
        if await self._passkeys.remove(session.sub, form.get("credential_id", ""), address):
            return "passkey-removed"
        return "passkey-gone"

    async def _unfit(self, session: BrowserSession, browser: Browser, address: str, now: int) -> Redirect | None:
        if self._passkeys is None:
            raise PageError(404, "Not available", "This service does not use second factors.")
        return await sign_in_unless_fit(self._factors, self._interaction, self._page, session, browser, address,
                                        now)
