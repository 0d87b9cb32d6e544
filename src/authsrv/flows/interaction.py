"""
The authorization endpoint's interaction (docs/design.md, Authorize errors,
Consent): authorize, then login when there is no live session or the
request asks for one, then consent unless remembered or first-party, then
the code. Every decision is made here; the web layer parses the request and
renders the L{authsrv.flows.outcomes} this returns.

A user with a second factor, or one a policy, the client or the request's
acr asks for it, gives it after the password (or enrols one), before any
session exists; a live session signed in without one is stepped up the
same way (L{authsrv.flows.mfa}).

The request waits in the store as an L{Interaction} between the steps, so
the browser's forms carry only its id and a CSRF token bound to the
browser's device secret; each step uses it up, so one of two racing
submissions goes on.
"""

from __future__ import annotations

from typing import cast
from urllib.parse import urlencode

import attrs
from twisted.internet.defer import Deferred

from authsrv import events
from authsrv.flows.answered import Answer, RecentAnswers
from authsrv.flows.csrf import form_token, form_token_valid, kept_for, tab_key, valid_device_secret
from authsrv.flows.login import LoggedIn, Refused, Suspended, Throttled
from authsrv.flows.mfa import Accepted, Held, SecondFactors
from authsrv.flows.passkeys import PASSKEY_METHODS, PasskeyAccepted, Passkeys
from authsrv.flows.pushed import PushedRequests
from authsrv.flows.standing import standing
from authsrv.flows.together import together
from authsrv.flows.outcomes import (
    Browser,
    ConsentForm,
    CookieChanges,
    EnrolmentForm,
    LoginForm,
    Redirect,
    SecondFactorForm,
    TabSecret,
)
from authsrv.flows.sessions import live_session, new_session, step_up_session
from authsrv.identity.credentials import MAX_LOGIN_BYTES, MAX_PASSWORD_BYTES, impossible_credential
from authsrv.protocol.authorize import (
    AuthorizeError,
    client_id_of,
    code_location,
    consent_needed,
    error_location,
    login_needed,
    max_age_passed,
    one_param,
    parse_request,
    refuse_silently,
    registered_redirect,
    unknown_client,
    unregistered_redirect,
)
from authsrv.protocol.errors import AccessDenied, InvalidRequest, LoginRequired, PageError
from authsrv.protocol.forwarded import address_key
from authsrv.protocol.logout import hint_claims
from authsrv.protocol.profiles import code_ttl_for
from authsrv.protocol.pushed import must_push
from authsrv.protocol.urls import origin
from authsrv.protocol.oidc import with_second_factor
from authsrv.records import (
    ACR_MFA,
    ACR_PWD,
    CONSENT_STAGE,
    ENROL_STAGE,
    LOGIN_STAGE,
    MFA_STAGE,
    PASSWORD_AMR,
    AuthorizationCode,
    AuthorizationRequest,
    BrowserSession,
    Client,
    Grant,
    Interaction,
)
from authsrv.store.codes import CodeFound
from authsrv.tokens import new_token, token_hash

INCORRECT = "The username or password is incorrect."
MISSING = "Enter your username and password."
IMPOSSIBLE = {
    "text": "The {field} was not sent as UTF-8 text, so it cannot be right; type it again.",
    "nul": "The {field} holds a NUL character, which no {kind} can; check what was pasted into the field.",
    "long": "The {field} is longer than any {kind} can be ({kib} KiB); check what was pasted into the field.",
}
"""What a form says, by L{impossible_credential}, of a username or password no user can have."""
UNAVAILABLE = "Signing in is not possible right now; please try again later."
FORM_EXPIRED = "This form expired or was not sent by this site; start again from the application."
ENDED = ("This sign-in has already finished, or it took too long and expired; if the application did not sign"
         " you in, start again from there.")
SIGNED_OUT = "You are no longer signed in; start again from the application."
WRONG_CODE = "That code is not right, or was used already. Try the next code from your app."
MISSING_CODE = "Enter the code from your authenticator app, or a recovery code."
WRONG_FIRST_CODE = "That code does not match; check the time on your phone and try the current code."
MUST_ENROL = "Setting up a second factor is required now; you cannot put it off any longer."
PASSKEY_REFUSED = "That passkey was not accepted. Try again, or sign in another way."
NOT_HINTED = ("the user who signed in is not the one the id_token_hint names: sign in as that user, or start"
              " again from the application to use another account")

ACCOUNT_CLIENT = Client(client_id="urn:authsrv:account", secret_hash=None, redirect_uris=(), name="your account",
                        first_party=True)
"""
The client of a sign-in the account page asks for (L{InteractionFlow.sign_in_again}):
no configured or registered client can have its id, which holds a ':'.
"""

ANOTHER_ACCOUNT = {"account": "other"}
"""
The login form's query for its "not you?" link: the form of the same
sign-in without the login hint (L{InteractionFlow.login_form}).
"""

_STAGE_PATHS = {LOGIN_STAGE: "/login", MFA_STAGE: "/mfa", ENROL_STAGE: "/mfa/enrol", CONSENT_STAGE: "/consent"}


def too_many_attempts(retry_after: int) -> str:
    return f"Too many attempts; try again in {retry_after} second{'s' if retry_after != 1 else ''}."


def suspended(reason: str | None) -> PageError:
    """A correct password for a banned or disabled account (docs/design.md, Brute force)."""
    message = "This account is suspended, so it cannot sign in here."
    if reason:
        message += f" Reason: {reason}"
    return PageError(403, "Account suspended", message)


def too_many_waiting(retry_after: int) -> PageError:
    """
    The client address already keeps C{pending_per_address} anonymous
    requests waiting for the login form: 429, never a redirect.
    """
    minutes = max(1, -(-retry_after // 60))
    return PageError(
        429, "Too many sign-ins",
        f"Too many sign-ins are in progress from your network; finish one of them or wait "
        f"{minutes} minute{'s' if minutes != 1 else ''} and start again from the application.",
        retry_after=retry_after,
    )


def impossible_message(value: str, field: str, max_bytes: int, kind: str | None = None) -> str | None:
    """
    L{IMPOSSIBLE}'s sentence for the form's C{field} (a C{kind} of
    credential, the field's name by default) if no user can have C{value},
    else None.
    """
    impossible = impossible_credential(value, max_bytes)
    if impossible is None:
        return None
    return IMPOSSIBLE[impossible].format(field=field, kind=kind or field, kib=max_bytes // 1024)


def _expired() -> PageError:
    """
    A sign-in that is over: expired, or finished (the back button to one of
    its pages, a form posted twice), which must not read as the user's fault.
    """
    return PageError(400, "Sign-in ended", ENDED)


def _device_of(browser: Browser, stored: str, interaction_id: str) -> str | None:
    """
    The device secret that binds an interaction's forms in this browser: its
    tab's copy (L{TabSecret}) when that one made the form's token C{stored},
    else its device cookie.
    """
    tab = browser.tabs.get(tab_key(interaction_id))
    return tab if kept_for(stored, tab, interaction_id) else browser.device


def _forged() -> PageError:
    return PageError(400, "Sign-in cannot continue", FORM_EXPIRED)


class InteractionFlow:
    """
    C{login} is an L{authsrv.flows.login.PasswordLogin}; C{sessions} an
    L{authsrv.flows.sessions.SessionEnder}, which ends the browser's earlier
    session at a new login of another user and tells its clients (the same
    user's carries on under its sid); C{clients} answers
    C{get_client}; C{limits} gives the code, session and interaction
    lifetimes; C{factors} are the users' second factors and C{passkeys}
    their passkeys (None when second factors are off); C{pushed} the
    L{PushedRequests} (None when the server offers no pushed requests);
    C{dpop} whether DPoP is offered, so that a request's dpop_jkt binds its code;
    C{keystore} checks an id_token_hint's signature.
    """

    def __init__(self, *, store, clients, identity, login, sessions, limits, issuer: str,
                 factors: SecondFactors, show_ban_reason: bool = False, passkeys: Passkeys | None = None,
                 pushed: PushedRequests | None = None, dpop: bool = False, keystore):
        self._keystore = keystore
        self._pushed = pushed
        self._dpop = dpop
        self._factors = factors
        self._passkeys = passkeys
        self._show_ban_reason = show_ban_reason
        self._store = store
        self._sessions = sessions
        self._clients = clients
        self._identity = identity
        self._login = login
        self._limits = limits
        self._issuer = issuer
        self._answers = RecentAnswers()

    async def authorize(self, args: dict[bytes, list[bytes]], browser: Browser, address: str,
                        now: int) -> Redirect | LoginForm:
        """
        An authorization request (RFC 6749 section 4.1.1): the login form
        itself, or on to the second factor, consent, or the client. One that
        waits for the login form counts toward its client C{address}'s cap of
        such requests. A pushed request's C{request_uri} is used up here
        (RFC 9126 section 4), so its login form is a page of its own that a
        reload shows again, where a reload of this URL would be refused.
        """
        client_id = client_id_of(args)
        client = await self._clients.get_client(client_id) if client_id is not None else None
        pushed, push_required, by_reference = self._pushed, False, False
        if client is not None and pushed is not None and b"request_uri" in args:
            args = await pushed.take(client, args, now, address)
            by_reference = True
        elif client is not None:
            push_required = must_push(client, pushed is not None and pushed.required)
        try:
            request = parse_request(client, args, push_required=push_required)
            assert client is not None, "parse_request refuses an unknown client"
            session = await self.live_session(browser.session, now)
            request = await self._with_hint(args, request, session)
            if session is None or login_needed(request, session, now):
                return await self._to_login(client, request, browser, now, address, by_reference)
            stage = await self._factors.demand(client, request, session.sub, session.acr, now, session.amr)
            if self._stale_enrolment(stage, session, now):
                return await self._to_login(client, request, browser, now, address, by_reference)
            if stage is not None:
                refuse_silently(request, login=True, consent=False)
                return await self._wait(request, stage, session.sid, browser, now, sub=session.sub, amr=session.amr)
            return await self._after_login(client, request, session, browser, now, 302, address)
        except AuthorizeError as e:
            return Redirect(error_location(self._issuer, e.redirect_uri, e.state, e.error))

    async def _to_login(self, client: Client, request: AuthorizationRequest, browser: Browser, now: int,
                        address: str, by_reference: bool) -> Redirect | LoginForm:
        """The login form for an authorization request: its own answer, or a page of its own for a pushed one."""
        refuse_silently(request, login=True, consent=False)
        if by_reference:
            return await self._wait(request, LOGIN_STAGE, None, browser, now, address)
        return await self._login_here(client, request, browser, now, address)

    def _stale_enrolment(self, stage: str | None, session: BrowserSession, now: int) -> bool:
        """
        Whether the live C{session} would enrol a first factor though it
        signed in longer ago than C{[mfa] recent_sign_in}: the password is
        asked for first, as a session cookie alone enrols none.
        """
        return stage == ENROL_STAGE and not self._factors.recent(session, now)

    async def _with_hint(self, args: dict[bytes, list[bytes]], request: AuthorizationRequest,
                         session: BrowserSession | None) -> AuthorizationRequest:
        """
        OIDC Core section 3.1.2.1: an C{id_token_hint} names the user the
        client expects, and the request keeps that user so that a sign-in by
        anyone else ends in login_required (L{_refused_for_hint}). Another user
        signed in here must sign in again (or, with prompt=none, the client
        hears login_required), the login form showing the hinted user's
        login unless a login_hint says otherwise; a hint this server did not
        sign, or signed for another client (the hint is of a session "with
        the Client", as node-oidc-provider also insists), is
        invalid_request. Its expiry is not checked.
        """
        hint = one_param(args, b"id_token_hint")
        if not hint:
            return request
        try:
            claims = hint_claims(hint, self._keystore.hint_key, self._issuer)
        except PageError:
            error = InvalidRequest("id_token_hint is not an ID token this server issued")
            raise AuthorizeError(error, request.redirect_uri, request.state) from None
        aud = claims.get("aud")
        if request.client_id not in (aud if isinstance(aud, list) else [aud]):
            error = InvalidRequest("id_token_hint was issued to another client; send an ID token this client received")
            raise AuthorizeError(error, request.redirect_uri, request.state)
        request = attrs.evolve(request, hinted_sub=claims["sub"])
        if session is not None and session.sub == claims["sub"]:
            return request
        hinted = None if request.login_hint else await self._identity.user_by_id(claims["sub"])
        return attrs.evolve(request, prompt=request.prompt | {"login"},
                            login_hint=hinted.login if hinted is not None else request.login_hint)

    async def login_form(self, form: dict[str, str] | None, browser: Browser, now: int) -> LoginForm:
        """The waiting request's login form; with L{ANOTHER_ACCOUNT}, without its login hint."""
        interaction, client = await self._interaction(form, LOGIN_STAGE, now, shown_to=browser)
        another = ANOTHER_ACCOUNT.items() <= (form or {}).items()
        return await self._first_login_form(interaction, client, now, hinted=not another)

    async def _first_login_form(self, interaction: Interaction, client: Client, now: int, *,
                                hinted: bool = True) -> LoginForm:
        """The form as a waiting request first shows it: the login hint as the user name, a passkey challenge."""
        username = (interaction.request.login_hint or "") if hinted else ""
        login_form = self._login_form(200, interaction, client, username=username)
        return await self._with_passkey(login_form, now)

    async def _with_passkey(self, login_form: LoginForm, now: int) -> LoginForm:
        """The form with a fresh passkey challenge for its interaction, when passkeys are on."""
        if self._passkeys is None:
            return login_form
        options = await self._passkeys.sign_in_options(login_form.interaction_id, now)
        return attrs.evolve(login_form, passkey_options=options)

    async def submit_passkey(self, form: dict[str, str] | None, browser: Browser, address: str,
                             now: float) -> LoginForm | Redirect:
        """
        A passkey instead of the password: the discoverable credential
        names the user; then a second factor if the user has one besides
        passkeys (or a policy wants one), the session, consent or the code.
        """
        if form is None or self._passkeys is None:
            raise _forged()
        seconds = int(now)
        interaction, client = await self._interaction(form, LOGIN_STAGE, seconds)
        self._check_csrf(form, browser, interaction)
        outcome = await self._passkeys.authenticate(interaction.interaction_id, form.get("credential"), address,
                                                    seconds)
        if not isinstance(outcome, PasskeyAccepted):
            return await self._with_passkey(self._login_form(200, interaction, client, message=PASSKEY_REFUSED),
                                            seconds)
        sub = outcome.passkey.sub
        await self._still_allowed(sub, None, address, seconds)
        if not await self._store.take_interaction(interaction.interaction_id, LOGIN_STAGE):
            raise _expired()
        refused = self._refused_for_hint(client, interaction.request, sub, address, 303)
        if refused is not None:
            return refused
        amr = (outcome.method, "user")
        stage = await self._factors.demand(client, interaction.request, sub, None, seconds, amr)
        if stage is not None:
            return await self._wait(interaction.request, stage, None, browser, seconds, sub=sub, amr=amr)
        return await self._signed_in(client, interaction.request, sub, None, browser, address, amr, ACR_PWD,
                                     seconds)

    async def submit_second_passkey(self, form: dict[str, str] | None, browser: Browser, address: str,
                                    now: float) -> SecondFactorForm | Redirect:
        """One of the user's passkeys as the second factor: the session at the MFA class, then consent or the code."""
        if form is None or self._passkeys is None:
            raise _forged()
        seconds = int(now)
        interaction, client, session = await self._factor_stage(form, MFA_STAGE, browser, seconds)
        self._check_csrf(form, browser, interaction)
        sub = interaction.sub
        assert sub is not None, "a second-factor interaction names its user"
        outcome = await self._passkeys.authenticate(interaction.interaction_id, form.get("credential"), address,
                                                    seconds, sub=sub)
        if not isinstance(outcome, PasskeyAccepted):
            return await self._second_factor_form(200, interaction, client, PASSKEY_REFUSED, now=seconds)
        await self._still_allowed(sub, session, address, seconds)
        if not await self._store.take_interaction(interaction.interaction_id, MFA_STAGE):
            raise _expired()
        events.mfa_succeeded(sub=sub, method=outcome.method, address=address)
        amr = with_second_factor(interaction.amr, outcome.method)
        return await self._signed_in(client, interaction.request, sub, session, browser, address, amr, ACR_MFA,
                                     seconds)

    async def submit_login(self, form: dict[str, str] | None, browser: Browser, address: str,
                           now: float) -> LoginForm | Redirect:
        """The sign-in form posted: the password checked, a new session, then consent or the code."""
        if form is None:
            raise _forged()
        if again := await self._answered_before(form, browser, int(now)):
            return again
        interaction, client = await self._interaction(form, LOGIN_STAGE, int(now))
        self._check_csrf(form, browser, interaction)
        username, password = form.get("username", ""), form.get("password", "")
        for field, value, max_bytes in (("username", username, MAX_LOGIN_BYTES),
                                        ("password", password, MAX_PASSWORD_BYTES)):
            if message := impossible_message(value, field, max_bytes):
                return self._login_form(400, interaction, client, username=username if field == "password" else "",
                                        message=message)
        if not username or not password:
            return self._login_form(200, interaction, client, username=username, message=MISSING)
        outcome = await self._login.log_in(
            username, password, address, browser.device, now,
            along=lambda: self._store.take_interaction(interaction.interaction_id, LOGIN_STAGE),
            reading=(lambda sub: Deferred.fromCoroutine(self._factors.held(sub))) if self._factors.policy.enabled
            else None,
        )
        if isinstance(outcome, Throttled):
            return self._login_form(429, interaction, client, username=username,
                                    message=too_many_attempts(outcome.retry_after),
                                    retry_after=outcome.retry_after)
        if isinstance(outcome, Refused):
            return self._login_form(200, interaction, client, username=username, message=INCORRECT)
        if isinstance(outcome, Suspended):
            raise suspended(outcome.reason if self._show_ban_reason else None)
        if not isinstance(outcome, LoggedIn):
            return self._login_form(503, interaction, client, username=username, message=UNAVAILABLE)
        if not outcome.along:
            if again := await self._answered_before(form, browser, int(now)):
                return again
            raise _expired()
        refused = self._refused_for_hint(client, interaction.request, outcome.user.sub, address, 303)
        if refused is not None:
            return refused
        seconds = int(now)
        stage = await self._factors.demand(client, interaction.request, outcome.user.sub, None, seconds, PASSWORD_AMR,
                                           cast(Held | None, outcome.read))
        if stage is not None:
            waiting = await self._wait(interaction.request, stage, None, browser, seconds,
                                       sub=outcome.user.sub, amr=PASSWORD_AMR)
            self._answers.keep(interaction.interaction_id, waiting.location, None, interaction.csrf_token, None,
                               seconds)
            return waiting
        return await self._signed_in(client, interaction.request, outcome.user.sub, None, browser, address,
                                     PASSWORD_AMR, ACR_PWD, seconds, answering=interaction)

    async def second_factor_form(self, form: dict[str, str] | None, browser: Browser, now: int) -> SecondFactorForm:
        interaction, client, _ = await self._factor_stage(form, MFA_STAGE, browser, now, shown=True)
        return await self._second_factor_form(200, interaction, client, now=now)

    async def submit_second_factor(self, form: dict[str, str] | None, browser: Browser, address: str,
                                   now: float) -> SecondFactorForm | Redirect:
        """A TOTP or recovery code posted: counted by the throttle, then the session, then consent or the code."""
        if form is None:
            raise _forged()
        seconds = int(now)
        if again := await self._answered_before(form, browser, seconds):
            return again
        interaction, client, session = await self._factor_stage(form, MFA_STAGE, browser, seconds)
        self._check_csrf(form, browser, interaction)
        code = form.get("code", "").strip()
        if not code:
            return await self._second_factor_form(200, interaction, client, MISSING_CODE, now=seconds)
        sub = interaction.sub
        assert sub is not None, "a second-factor interaction names its user"
        outcome = await self._factors.verify(sub, code, address, browser.device, seconds)
        if isinstance(outcome, Throttled):
            return await self._second_factor_form(429, interaction, client, too_many_attempts(outcome.retry_after),
                                                  outcome.retry_after, now=seconds)
        if not isinstance(outcome, Accepted):
            return await self._second_factor_form(200, interaction, client, WRONG_CODE, now=seconds)
        await self._still_allowed(sub, session, address, seconds)
        if not await self._store.take_interaction(interaction.interaction_id, MFA_STAGE):
            if again := await self._answered_before(form, browser, seconds):
                return again
            raise _expired()
        return await self._signed_in(client, interaction.request, sub, session, browser, address,
                                     with_second_factor(interaction.amr, "otp"), ACR_MFA, seconds,
                                     answering=interaction)

    async def enrolment_form(self, form: dict[str, str] | None, browser: Browser, now: int,
                             shown: str | None = None) -> EnrolmentForm:
        """The enrolment page; the enrolment it C{shown} before (sealed) again, while it lasts."""
        interaction, client, _ = await self._factor_stage(form, ENROL_STAGE, browser, now, shown=True)
        return await self._enrolment_form(200, interaction, client, None, now, shown)

    async def submit_enrolment(self, form: dict[str, str] | None, browser: Browser, address: str,
                               now: float) -> EnrolmentForm | Redirect:
        """
        Confirm a new authenticator with its first code (the sign-in then
        counts as with a second factor), or put enrolment off while the
        grace period lasts. A user who has set up a factor since the page
        was shown gives that one instead: the password alone neither
        replaces nor skips it. Confirmed, the enrolment the browser kept
        goes with the answer: a reset of the factors later must not find
        the old key there and show it again.
        """
        if form is None:
            raise _forged()
        seconds = int(now)
        if again := await self._answered_before(form, browser, seconds):
            return again
        interaction, client, session = await self._factor_stage(form, ENROL_STAGE, browser, seconds)
        self._check_csrf(form, browser, interaction)
        sub = interaction.sub
        assert sub is not None, "an enrolment interaction names its user"
        await self._still_allowed(sub, session, address, seconds)
        if await self._factors.has_factor(sub):
            if not await self._store.take_interaction(interaction.interaction_id, ENROL_STAGE):
                if again := await self._answered_before(form, browser, seconds):
                    return again
                raise _expired()
            return await self._wait(interaction.request, MFA_STAGE, interaction.sid, browser, seconds, sub=sub,
                                    amr=interaction.amr)
        if form.get("action") == "later":
            grace_until = await self._factors.grace_until(sub, seconds)
            if grace_until is None:
                return await self._enrolment_form(200, interaction, client, MUST_ENROL, seconds, form.get("sealed"))
            if not await self._store.take_interaction(interaction.interaction_id, ENROL_STAGE):
                if again := await self._answered_before(form, browser, seconds):
                    return again
                raise _expired()
            events.mfa_enrolment_put_off(sub=sub, grace_until=grace_until, address=address)
            return await self._signed_in(client, interaction.request, sub, session, browser, address,
                                         interaction.amr, ACR_PWD, seconds, answering=interaction)
        if session is not None and not self._factors.recent(session, seconds):
            return await self._sign_in_first(interaction, browser, address, seconds)
        if not await self._factors.confirm(sub, form.get("sealed"), form.get("code", ""), seconds, address):
            return await self._enrolment_form(200, interaction, client, WRONG_FIRST_CODE, seconds,
                                              form.get("sealed"))
        if not await self._store.take_interaction(interaction.interaction_id, ENROL_STAGE):
            if again := await self._answered_before(form, browser, seconds):
                return again
            raise _expired()
        return await self._signed_in(client, interaction.request, sub, session, browser, address,
                                     with_second_factor(interaction.amr, "otp"), ACR_MFA, seconds,
                                     answering=interaction, end_enrolment=True)

    async def _still_allowed(self, sub: str, session: BrowserSession | None, address: str, now: int) -> None:
        """
        Refuse a sign-in whose user was banned or disabled after its first
        factor: its second factor must not make a session. A step-up's
        live session was checked as it was read (L{live_session}).
        """
        if session is not None:
            return
        user_standing = await standing(self._identity, self._store, sub, now)
        if not user_standing.allowed:
            events.login_suspended(sub=sub, address=address, reason="banned or disabled")
            raise suspended(user_standing.ban_reason if self._show_ban_reason else None)

    async def _sign_in_first(self, interaction: Interaction, browser: Browser, address: str, now: int) -> Redirect:
        """
        A step-up's enrolment confirmed once its session's sign-in is older
        than C{[mfa] recent_sign_in} (the page waits longer): its request
        goes to the login form first, as L{_stale_enrolment} sends it there.
        """
        if not await self._store.take_interaction(interaction.interaction_id, ENROL_STAGE):
            raise _expired()
        return await self._wait(interaction.request, LOGIN_STAGE, None, browser, now, address)

    async def _signed_in(self, client: Client, request: AuthorizationRequest, sub: str,
                         session: BrowserSession | None, browser: Browser, address: str,
                         amr: tuple[str, ...], acr: str, now: int, answering: Interaction | None = None,
                         end_enrolment: bool = False) -> Redirect:
        """
        The sign-in done by C{amr} at C{acr}: a new session, or the live
        C{session} it stepped up (raised to the MFA class, or left as it
        was when enrolment was put off; one signed out meanwhile stays
        signed out), then consent or the code. A new session of the user
        the browser's earlier one was for keeps that one's sid
        (L{authsrv.flows.sessions.SessionEnder.replace}). The answer to the
        form of the interaction it is C{answering} is kept for that form
        sent again (L{_answered_before}), with the session cookie it sets
        and C{end_enrolment}, a confirmed enrolment's drop of the enrolment
        the browser kept.
        """
        value: str | None = None
        created = []
        if session is None:
            earlier = await self._sessions.replace(browser.session, sub, now, address)
            value, session = new_session(self._limits, sub, now, amr, acr,
                                         address=address, user_agent=browser.user_agent)
            if earlier is not None:
                session = attrs.evolve(session, sid=earlier.sid, created_at=earlier.created_at)
            created.append(self._store.create_session(session).addCallback(
                lambda _: events.login_succeeded(sub=sub, client_id=client.client_id, address=address)))
        elif acr == ACR_MFA:
            raised = await step_up_session(self._store, session, amr, acr, now)
            if raised is None:
                raise PageError(400, "Signed out", SIGNED_OUT)
            value, session = raised
        # A new session goes to the store with the code (or the consent's interaction).
        answer, *_ = await together(
            [Deferred.fromCoroutine(self._after_login(client, request, session, browser, now, 303, address,
                                                      ending=not created, answering=answering)),
             *created])
        if answering is not None:
            code = self._answers.recall(answering.interaction_id, now)
            self._answers.keep(answering.interaction_id, answer.location, code.code_hash if code else None,
                               answering.csrf_token, session.sid, now, value, end_enrolment)
        return Redirect(answer.location, answer.status, CookieChanges(session=value, device=answer.cookies.device,
                                                                       tab=answer.cookies.tab,
                                                                       end_enrolment=end_enrolment))

    async def consent_form(self, form: dict[str, str] | None, browser: Browser, now: int) -> ConsentForm:
        interaction, client, session = await self._consent_stage(form or {}, browser, now, shown=True)
        user = await self._identity.user_by_id(session.sub)
        return ConsentForm(
            client_name=client.name or client.client_id,
            user_label=user.login if user else session.sub,
            scope=interaction.request.scope,
            interaction_id=interaction.interaction_id,
            csrf=interaction.csrf_token,
            client_origin=origin(interaction.request.redirect_uri),
            unvetted=client.registered_itself,
        )

    async def submit_consent(self, form: dict[str, str] | None, browser: Browser, address: str,
                             now: int) -> Redirect:
        """
        Allow: the code issued, then the consent remembered (none for a
        client removed meanwhile, which gets no code); deny: access_denied
        to the client. An approval once the session's authentication is
        older than the request's max_age is remembered, and the user signs
        in again (counted toward C{address}'s cap) before any code: the
        consent page is not asked for again, so a slow reader is not sent
        round in a loop. A sign-in made to reach this page meets max_age
        however long the page stayed open, as in node-oidc-provider, so a
        new user never types the password twice; so does one in another tab
        after the page was made: either is after the request, which is all
        OIDC Core 3.1.2.1 asks of auth_time.
        """
        if form is None:
            raise _forged()
        if again := await self._answered_before(form, browser, now):
            return again
        interaction, client, session = await self._consent_stage(form, browser, now)
        action = form.get("action")
        self._check_csrf(form, browser, interaction)
        if action not in ("approve", "deny"):
            raise _forged()
        if not await self._store.take_interaction(interaction.interaction_id, CONSENT_STAGE):
            if again := await self._answered_before(form, browser, now):
                return again
            raise _expired()
        request = interaction.request
        if action == "deny":
            events.consent_denied(sub=session.sub, client_id=client.client_id, address=address)
            denied = AccessDenied("the user denied the request")
            location = error_location(self._issuer, request.redirect_uri, request.state, denied)
            self._answers.keep(interaction.interaction_id, location, None, interaction.csrf_token, session.sid, now)
            return Redirect(location, 303)
        if max_age_passed(request, session, now) and session.auth_time < interaction.created_at:
            return await self._approved_then_sign_in(client, request, session, browser, address, now)
        location = await self._issue_code(client, request, session, now, address, answering=interaction)
        await self._remember_consent(session.sub, client, request.scope, now, address)
        return Redirect(location, 303)

    async def _answered_before(self, form: dict[str, str], browser: Browser, now: int) -> Redirect | None:
        """
        The answer this browser's form got when it was sent a moment ago
        (L{authsrv.flows.answered}), while the session it answered is still
        live and the browser's (or, for a new session the answer set, the
        browser is signed in with no other), and the code it carries is
        unused; else None. A form sent again after a sign-out, by the next
        person signed in on that browser, must not get the code or session
        of the one before.
        """
        interaction_id = form.get("request")
        if not interaction_id:
            return None
        answer = self._answers.recall(interaction_id, now)
        if answer is None or not form_token_valid(answer.csrf_token, form.get("csrf"),
                                                  _device_of(browser, answer.csrf_token, interaction_id),
                                                  interaction_id):
            return None
        new_session = answer.session not in (None, browser.session)
        if answer.sid is not None and not await self._still_signed_in(answer, browser.session, now):
            return None
        if answer.code_hash is not None and not isinstance(await self._store.find_code(answer.code_hash, now),
                                                           CodeFound):
            return None
        return Redirect(answer.location, 303, CookieChanges(session=answer.session if new_session else None,
                                                            end_enrolment=answer.end_enrolment))

    async def _still_signed_in(self, answer: Answer, cookie: str | None, now: int) -> bool:
        """
        Whether the session C{answer} was for is live, and the browser's
        (C{cookie}): the one it set, or, as the form sent again does not
        carry that yet, no other live session than its own.
        """
        session = await self.live_session(answer.session or cookie, now)
        if session is None or session.sid != answer.sid:
            return False
        if answer.session is None or cookie in (None, answer.session):
            return True
        current = await self.live_session(cookie, now)
        return current is None or current.sid == answer.sid

    async def _approved_then_sign_in(self, client: Client, request: AuthorizationRequest, session: BrowserSession,
                                     browser: Browser, address: str, now: int) -> Redirect:
        """
        An approval given once max_age passed: remembered (for a client the
        store still holds, L{_remember_consent}), then the same request
        waits for a sign-in again, without prompt=consent.
        """
        await self._remember_consent(session.sub, client, request.scope, now, address)
        again = attrs.evolve(request, prompt=request.prompt - {"consent"})
        return await self._wait(again, LOGIN_STAGE, None, browser, now, address)

    async def live_session(self, cookie: str | None, now: int) -> BrowserSession | None:
        """
        The browser's live session (L{authsrv.flows.sessions.live_session}); one
        of a user no longer allowed ends, and its clients hear by back-channel logout.
        """
        return await live_session(self._store, self._identity, cookie, now, self._sessions)

    async def device_session(self, client: Client, return_to: str, browser: Browser, session: BrowserSession | None,
                             address: str, now: int) -> BrowserSession | Redirect:
        """
        The live session that may approve a device of C{client} at the
        verification page (C{return_to}, this service's own URL), or the
        way to one: the same sign-in as for an authorization request,
        second factors included, that comes back to C{return_to}.
        C{session} is the browser's live session as the caller read it.
        """
        request = AuthorizationRequest(client_id=client.client_id, redirect_uri=return_to, scope=(), state="",
                                       code_challenge="", device=True)
        if session is None:
            return await self._wait(request, LOGIN_STAGE, None, browser, now, address)
        stage = await self._factors.demand(client, request, session.sub, session.acr, now, session.amr)
        if self._stale_enrolment(stage, session, now):
            return await self._wait(request, LOGIN_STAGE, None, browser, now, address)
        if stage is not None:
            return await self._wait(request, stage, session.sid, browser, now, sub=session.sub, amr=session.amr)
        return session

    async def sign_in_again(self, return_to: str, sub: str | None, browser: Browser, address: str,
                            now: int) -> Redirect:
        """
        A fresh sign-in for the account page (the password or a passkey,
        then the user's second factor as at any sign-in), the form showing
        user C{sub}'s login (an empty form for a browser without a session,
        C{sub} None), that comes back to C{return_to}: one of the account
        pages' own fixed URLs, never one a request names, so it redirects
        nowhere else. It counts toward C{address}'s cap of waiting sign-ins.
        """
        user = await self._identity.user_by_id(sub) if sub is not None else None
        request = AuthorizationRequest(client_id=ACCOUNT_CLIENT.client_id, redirect_uri=return_to, scope=(),
                                       state="", code_challenge="", login_hint=user.login if user else None,
                                       device=True)
        return await self._wait(request, LOGIN_STAGE, None, browser, now, address)

    async def _after_login(self, client: Client, request: AuthorizationRequest, session: BrowserSession,
                           browser: Browser, now: int, status: int, address: str, *, ending: bool = True,
                           answering: Interaction | None = None) -> Redirect:
        """
        With a live session: the consent page or the code; back to the
        service's own page it came from (device verification, the account
        page). A session of another user than the request's id_token_hint
        named gets login_required instead: the last guard, as the first
        factor already refuses any other user (L{_refused_for_hint}). A
        session whose authentication grew older than max_age while a page
        was open (an enrolment put off) signs in again first. C{ending}:
        the session was stored before, so it may end meanwhile (L{_issue_code}),
        which keeps the answer of the form C{answering} with its code.
        """
        if request.device:
            return Redirect(request.redirect_uri, 303)
        refused = self._refused_for_hint(client, request, session.sub, address, status)
        if refused is not None:
            return refused
        if max_age_passed(request, session, now):
            return await self._wait(request, LOGIN_STAGE, None, browser, now, address)
        consented = None if client.first_party else await self._store.get_consent(session.sub, client.client_id)
        needed = consent_needed(client, request, consented)
        refuse_silently(request, login=False, consent=needed)
        if needed:
            return await self._wait(request, CONSENT_STAGE, session.sid, browser, now)
        return Redirect(await self._issue_code(client, request, session, now, address, ending=ending,
                                               answering=answering), status)

    def _refused_for_hint(self, client: Client, request: AuthorizationRequest, sub: str, address: str,
                          status: int) -> Redirect | None:
        """
        login_required at the client, audited, when C{sub} is not the user
        the request's id_token_hint names; None when it is, or there is none.
        Checked right after the first factor, so that another user is never
        asked for a second factor that could not help. That refusal makes no
        session and leaves the browser's earlier one as it was: a sign-in
        refused before its second factor is not complete, and every other
        user is refused at the same point, so the answer does not depend on
        whether the user has a second factor.
        """
        if request.hinted_sub is None or sub == request.hinted_sub:
            return None
        events.login_hint_mismatch(sub=sub, hinted_sub=request.hinted_sub, client_id=client.client_id,
                                   address=address)
        return Redirect(error_location(self._issuer, request.redirect_uri, request.state, LoginRequired(NOT_HINTED)),
                        status)

    async def _login_here(self, client: Client, request: AuthorizationRequest, browser: Browser, now: int,
                          address: str) -> LoginForm:
        """
        The login form as the authorization request's own answer, kept for
        the form's POST as L{_wait} keeps it: one redirect and one page
        request fewer for every browser that signs in.
        """
        interaction, cookies = await self._keep(request, LOGIN_STAGE, None, browser, now, address)
        form = await self._first_login_form(interaction, client, now)
        return attrs.evolve(form, cookies=cookies)

    async def _wait(self, request: AuthorizationRequest, stage: str, sid: str | None, browser: Browser,
                    now: int, address: str | None = None, *, sub: str | None = None,
                    amr: tuple[str, ...] = ()) -> Redirect:
        """Keep the request for the next stage (L{_keep}), and send the browser to that stage's page."""
        interaction, cookies = await self._keep(request, stage, sid, browser, now, address, sub=sub, amr=amr)
        location = f"{self._issuer}{_STAGE_PATHS[stage]}?{urlencode({'request': interaction.interaction_id})}"
        return Redirect(location, 303, cookies)

    async def _keep(self, request: AuthorizationRequest, stage: str, sid: str | None, browser: Browser,
                    now: int, address: str | None = None, *, sub: str | None = None,
                    amr: tuple[str, ...] = ()) -> tuple[Interaction, CookieChanges]:
        """
        Keep the request for the next stage, bound to this browser's device
        secret (made now if it has none, or a forged one: the new one is
        returned with the interaction, for its cookie, and for a copy of its
        own, L{TabSecret}, as another tab's first request may set another
        device cookie over this one meanwhile). An anonymous one
        (with its C{address}) waits for the login form for a shorter time,
        and only while its address is under the cap; one for the second
        factor names the user (C{sub}) and the methods already used (C{amr}).
        """
        limits = self._limits
        interaction_id = new_token()
        expires_at = now + (limits.login_request_ttl if stage in (LOGIN_STAGE, MFA_STAGE) else limits.pending_request_ttl)
        if valid_device_secret(browser.device):
            device, cookies = browser.device, CookieChanges()
        else:
            device = new_token()
            cookies = CookieChanges(device=device, tab=TabSecret(tab_key(interaction_id), device, expires_at - now))
        interaction = Interaction(
            interaction_id=interaction_id,
            stage=stage,
            request=request,
            csrf_token=form_token(device, interaction_id),
            created_at=now,
            expires_at=expires_at,
            sid=sid,
            address=None if address is None else address_key(address),
            sub=sub,
            amr=amr,
        )
        if address is not None and limits.pending_per_address:
            busy_until = await self._store.save_login_interaction(interaction, limits.pending_per_address)
            if busy_until is not None:
                raise too_many_waiting(busy_until - now)
        else:
            await self._store.save_interaction(interaction)
        return interaction, cookies

    async def _interaction(self, form: dict[str, str] | None, stage: str, now: int, *,
                           shown_to: Browser | None = None) -> tuple[Interaction, Client]:
        """
        The waiting request a form names, at C{stage}, and its client as it
        is now: a client removed since, or one that no longer registers the
        request's redirect URI, ends the sign-in on a page, so that no code
        or error is ever sent to an address it has given up (RFC 6749
        section 4.1.2.1). A page to show C{shown_to} a browser is only for
        the browser the request was kept for (L{kept_for}), as its form's
        token binds the POST: a leaked page URL opens nothing elsewhere, and
        another browser sees the sign-in as ended, as for an unknown id.
        """
        interaction_id = (form or {}).get("request")
        interaction = await self._store.get_interaction(interaction_id, now) if interaction_id else None
        if interaction is None or interaction.stage != stage:
            raise _expired()
        if shown_to is not None and not kept_for(interaction.csrf_token,
                                                 _device_of(shown_to, interaction.csrf_token,
                                                            interaction.interaction_id),
                                                 interaction.interaction_id):
            raise _expired()
        request = interaction.request
        client = ACCOUNT_CLIENT if request.device and request.client_id == ACCOUNT_CLIENT.client_id else (
            await self._clients.get_client(request.client_id))
        if client is None:
            raise _expired()
        if not request.device and not registered_redirect(client, request.redirect_uri):
            raise unregistered_redirect()
        return interaction, client

    async def _factor_stage(self, form: dict[str, str] | None, stage: str, browser: Browser, now: int, *,
                            shown: bool = False) -> tuple[Interaction, Client, BrowserSession | None]:
        """
        A second-factor or enrolment interaction, its client, and the live
        session it steps up (None for a sign-in without one yet); C{shown}:
        for its page, only to the browser it was kept for (L{_interaction}).
        """
        interaction, client = await self._interaction(form, stage, now, shown_to=browser if shown else None)
        if interaction.sid is None:
            return interaction, client, None
        session = await self.live_session(browser.session, now)
        if session is None or session.sid != interaction.sid:
            raise PageError(400, "Signed out", SIGNED_OUT)
        return interaction, client, session

    async def _second_factor_form(self, status: int, interaction: Interaction, client: Client,
                                  message: str | None = None, retry_after: int | None = None, *,
                                  now: int) -> SecondFactorForm:
        """
        The second-factor page: a code field when the user has TOTP, and
        their passkeys unless one was the first factor.
        """
        sub = interaction.sub
        assert sub is not None, "a second-factor interaction names its user"
        options = None
        passkey_first = any(method in PASSKEY_METHODS for method in interaction.amr)
        if self._passkeys is not None and not passkey_first and await self._passkeys.list(sub):
            options = await self._passkeys.sign_in_options(interaction.interaction_id, now, sub)
        return SecondFactorForm(
            status=status, client_name=client.name or client.client_id,
            interaction_id=interaction.interaction_id, csrf=interaction.csrf_token,
            client_origin=origin(interaction.request.redirect_uri), message=message, retry_after=retry_after,
            passkey_options=options, code=await self._factors.has_totp(sub),
        )

    async def _enrolment_form(self, status: int, interaction: Interaction, client: Client, message: str | None,
                              now: int, sealed: str | None = None) -> EnrolmentForm:
        """The enrolment page: the one posted back (C{sealed}) shown again, else a new secret."""
        sub = interaction.sub
        assert sub is not None, "an enrolment interaction names its user"
        user = await self._identity.user_by_id(sub)
        login = user.login if user else sub
        enrolment = await self._factors.open_enrolment(sub, sealed, login, now)
        if enrolment is None:
            enrolment = await self._factors.new_enrolment(sub, login, now)
        return EnrolmentForm(
            status=status, user_label=login, secret=enrolment.secret, otpauth_uri=enrolment.otpauth_uri,
            recovery_codes=enrolment.recovery_codes, sealed=enrolment.sealed,
            fields=(("request", interaction.interaction_id), ("csrf", interaction.csrf_token)),
            client_name=client.name or client.client_id, client_origin=origin(interaction.request.redirect_uri),
            grace_until=await self._factors.grace_until(sub, now), message=message,
        )

    async def _consent_stage(self, form: dict[str, str], browser: Browser, now: int, *, shown: bool = False):
        """The consent-stage interaction, its client and the session it waits on; C{shown} as in L{_factor_stage}."""
        interaction, client = await self._interaction(form, CONSENT_STAGE, now, shown_to=browser if shown else None)
        session = await self.live_session(browser.session, now)
        if session is None or session.sid != interaction.sid:
            raise PageError(400, "Signed out", SIGNED_OUT)
        return interaction, client, session

    @staticmethod
    def _check_csrf(form: dict[str, str], browser: Browser, interaction: Interaction) -> None:
        if not form_token_valid(interaction.csrf_token, form.get("csrf"),
                                _device_of(browser, interaction.csrf_token, interaction.interaction_id),
                                interaction.interaction_id):
            raise _forged()

    def _login_form(self, status: int, interaction: Interaction, client: Client, *, username: str = "",
                    message: str | None = None, retry_after: int | None = None) -> LoginForm:
        return LoginForm(
            status=status, client_name=client.name or client.client_id,
            interaction_id=interaction.interaction_id, csrf=interaction.csrf_token,
            client_origin=origin(interaction.request.redirect_uri),
            username=username, message=message, retry_after=retry_after,
        )

    async def _remember_consent(self, sub: str, client: Client, scope, now: int, address: str) -> None:
        """
        Add C{scope} to what the user consented to for the client, until
        revoked (the store merges); none is kept for a client the store no
        longer holds, which gets the unknown-client page (docs/design.md,
        Removed clients). Its audit event names the browser's C{address}.
        """
        granted = await self._store.save_consent(sub, client.client_id, scope, now, stored_client=client.stored)
        if granted is None:
            raise unknown_client()  # removed since this instance cached it
        events.consent_given(sub=sub, client_id=client.client_id, scope=" ".join(sorted(granted)), address=address)

    async def _issue_code(self, client: Client, request: AuthorizationRequest, session: BrowserSession,
                          now: int, address: str, *, ending: bool = True, answering: Interaction | None = None) -> str:
        """
        Store a new code with the grant it will start, bound to everything the
        request said and to the session's authentication; returns the redirect
        URI carrying it. The code itself is never stored or logged; its audit
        event names the browser's C{address}. With C{ending} (a session
        stored before this step, which may have ended since it was read),
        the session is read again once the grant is stored: an end that
        came between could not name the grant's client in its back-channel
        logout (it reads the clients from the session's grants), so the
        code is refused and the browser signed out; an end after the read
        finds the grant and tells its client. The answer to the consent
        form of the interaction it is C{answering} is kept for that form
        sent again (L{_answered_before}).
        """
        code = new_token()
        grant_id = new_token(16)
        scope = frozenset(request.scope)
        limits = self._limits
        stored = await self._store.save_code(
            AuthorizationCode(
                code_hash=token_hash(code), grant_id=grant_id, client_id=request.client_id, sub=session.sub,
                redirect_uri=request.redirect_uri, scope=scope, code_challenge=request.code_challenge,
                code_challenge_method="S256", nonce=request.nonce, resource=request.resources,
                auth_time=session.auth_time, sid=session.sid, issued_at=now,
                expires_at=now + code_ttl_for(client, limits.code_ttl),
                amr=session.amr, acr=session.acr, dpop_jkt=request.dpop_jkt if self._dpop else None,
            ),
            Grant(
                grant_id=grant_id, client_id=request.client_id, sub=session.sub, scope=scope,
                resource=request.resources, auth_time=session.auth_time, sid=session.sid, created_at=now,
                expires_at=now + limits.refresh_token_absolute_ttl, amr=session.amr, acr=session.acr,
            ),
            stored_client=client.stored,
        )
        if stored is False:
            raise unknown_client()  # removed since this instance cached it
        if ending and await self._store.get_session(session.session_hash, now) is None:
            await self._store.refuse_code(token_hash(code), now)
            raise PageError(400, "Signed out", SIGNED_OUT)
        events.code_issued(sub=session.sub, client_id=request.client_id, grant_id=grant_id, session_id=session.sid,
                           address=address)
        location = code_location(self._issuer, request, code)
        if answering is not None:
            self._answers.keep(answering.interaction_id, location, token_hash(code), answering.csrf_token,
                               session.sid, now)
        return location
