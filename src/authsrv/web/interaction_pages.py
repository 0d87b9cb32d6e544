"""
The login, second-factor, enrolment, consent and sign-out confirmation
pages: plain forms that work without JavaScript, built on
L{authsrv.web.pages.render_page} (escaping, no framing, no caching).
"""

from __future__ import annotations

from datetime import datetime, timezone
from functools import partial
from itertools import product
from urllib.parse import urlencode

import segno
from twisted.web.template import tags

from authsrv.flows.interaction import ANOTHER_ACCOUNT
from authsrv.flows.outcomes import (
    ConsentForm,
    EnrolmentForm,
    LoginForm,
    LogoutConfirmation,
    RecoveryCodes,
    SecondFactorForm,
)
from authsrv.web.pages import PreparedPage, passkey_script, render_page


def scope_words(scope: str, client_name: str) -> str:
    """What a scope lets the application do, in words a person understands."""
    return {
        "openid": "Confirm who you are (your user id)",
        "profile": "Your name and picture",
        "email": "Your email address and whether it is verified",
        "offline_access": f"Stay signed in to {client_name} when you are away"
                          " (keeps access until you revoke it)",
    }[scope]


def _hidden(request_id: str, csrf: str):
    return (
        tags.input(type="hidden", name="request", value=request_id),
        tags.input(type="hidden", name="csrf", value=csrf),
    )


def error_message(message: str | None) -> list:
    """Why a form is shown again, announced, and named by its fields' L{described_by}."""
    return [tags.p(class_="error", role="alert", id="message")(message)] if message else []


def described_by(message: bool) -> dict[str, str]:
    """A field's attributes that tie it to the form's L{error_message}, if shown, so a screen reader reads both."""
    return {"aria-describedby": "message"} if message else {}


def passkey_form(action: str, interaction_id: str, csrf: str, options: str | None, label: str) -> list:
    """
    A form that asks the browser for a passkey and posts its answer; hidden
    until the script finds WebAuthn in the browser. Empty without C{options}.
    """
    if options is None:
        return []
    return [
        tags.form(method="post", action=action, hidden="", id="passkey",
                  **{"data-passkey": "get", "data-options": options})(
            *_hidden(interaction_id, csrf),
            tags.input(type="hidden", name="credential", value=""),
            tags.button(type="submit")(label),
            tags.p(role="status"),
        ),
        passkey_script(),
    ]


def _login_content(message: bool, passkeys: bool, filled: bool, field) -> tuple:
    """
    The sign-in form's tags, with a message or a passkey form or neither, its
    texts left to C{field}. A C{filled} user name (a login hint, a retry)
    puts the cursor in the password field and offers another account.
    """
    described = described_by(message)
    return (
        tags.p("to continue to ", tags.strong(field("client_name"))),
        *(error_message(field("message")) if message else []),
        tags.form(method="post", action=field("action"))(
            tags.label(for_="username")("Username"),
            tags.input(type="text", id="username", name="username", value=field("username"), required="",
                       autocomplete="username", autocapitalize="none", spellcheck="false",
                       **described, **({} if filled else {"autofocus": ""})),
            *([tags.p(tags.small("Not you? ", tags.a(href=field("another_account"))("Use another account")))]
              if filled else []),
            tags.label(for_="password")("Password"),
            tags.input(type="password", id="password", name="password", required="",
                       autocomplete="current-password", **described, **({"autofocus": ""} if filled else {})),
            *_hidden(field("interaction_id"), field("csrf")),
            tags.button(type="submit", class_="primary")("Sign in"),
        ),
        *(passkey_form(field("passkey_action"), field("interaction_id"), field("csrf"), field("passkey_options"),
                       "Sign in with a passkey") if passkeys else []),
    )


_LOGIN_PAGES = {shape: PreparedPage("Sign in", partial(_login_content, *shape))
                for shape in product((False, True), repeat=3)}
"""The login page in its eight shapes, prepared once: it is shown in every sign-in."""


def login_page(request, action: str, form: LoginForm) -> bytes:
    """The sign-in form, and a passkey instead when passkeys are on; its C{message} says why it is shown again."""
    if form.retry_after is not None:
        request.setHeader(b"retry-after", str(form.retry_after).encode())
    page = _LOGIN_PAGES[bool(form.message), form.passkey_options is not None, bool(form.username)]
    return page.render(request, form.status, form.client_origin, client_name=form.client_name,
                       message=form.message or "", action=action, username=form.username,
                       another_account=another_account(action, form.interaction_id),
                       interaction_id=form.interaction_id, csrf=form.csrf,
                       passkey_action=f"{action}/passkey", passkey_options=form.passkey_options or "")


def another_account(action: str, interaction_id: str) -> str:
    """The login form of the same sign-in without the user name it was shown with (L{ANOTHER_ACCOUNT})."""
    return f"{action}?{urlencode({'request': interaction_id, **ANOTHER_ACCOUNT})}"


def second_factor_page(request, action: str, form: SecondFactorForm) -> bytes:
    """
    Asks for the code of the user's authenticator app, or a recovery code,
    after the password; or one of their passkeys.
    """
    if form.retry_after is not None:
        request.setHeader(b"retry-after", str(form.retry_after).encode())
    code = [tags.form(method="post", action=action)(
        tags.label(for_="code")("Code from your authenticator app"),
        tags.input(type="text", id="code", name="code", required="", autocomplete="one-time-code",
                   autocapitalize="none", spellcheck="false", autofocus="", **described_by(bool(form.message))),
        tags.p(tags.small("Lost your phone? Enter one of your recovery codes instead.")),
        *_hidden(form.interaction_id, form.csrf),
        tags.button(type="submit", class_="primary")("Continue"),
    )] if form.code else []
    return render_page(
        request,
        form.status,
        "Confirm it is you" if not form.code else "Enter your code",
        tags.p("to continue to ", tags.strong(form.client_name)),
        *error_message(form.message),
        *code,
        *passkey_form(f"{action}/passkey", form.interaction_id, form.csrf, form.passkey_options,
                      "Use a passkey"),
        form_origin=form.client_origin,
    )


def qr_code(text: str) -> str:
    """A QR code of C{text} as an SVG data: URI (the pages' CSP allows data: images)."""
    return segno.make(text, error="m").svg_data_uri(scale=4, border=2)


def _day(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%d %B %Y")


def enrolment_page(request, action: str, form: EnrolmentForm) -> bytes:
    """
    A new authenticator to set up: its QR code and secret, the recovery
    codes shown this once, and a field for the first code; during a
    sign-in within the grace period, a button to do it later.
    """
    lead = [tags.p("Before continuing to ", tags.strong(form.client_name),
                   ", set up a second factor for ", tags.strong(form.user_label), ".")] if form.client_name else [
        tags.p("Set up an authenticator app for ", tags.strong(form.user_label), ".")]
    if form.recovery_csrf is not None:
        lead.append(tags.p("Confirming replaces your current authenticator and recovery codes."))
    later = []
    if form.grace_until is not None:
        later = [tags.button(type="submit", name="action", value="later", formnovalidate="")("Not now"),
                 tags.p(tags.small(f"You can put this off until {_day(form.grace_until)}."))]
    recovery = []
    if form.recovery_csrf is not None:
        recovery = [tags.form(method="post", action=action.rsplit("/", 1)[0] + "/recovery")(
            tags.input(type="hidden", name="csrf", value=form.recovery_csrf),
            tags.button(type="submit")("Get new recovery codes instead"),
        )]
    return render_page(
        request,
        form.status,
        "Set up two-step sign-in",
        *lead,
        *error_message(form.message),
        tags.p("1. Scan this code with your authenticator app, or type in the key below it."),
        tags.img(src=qr_code(form.otpauth_uri), alt="QR code of your new authenticator key", width="200"),
        tags.p(tags.code(form.secret)),
        tags.p("2. Keep these recovery codes somewhere safe. Each one signs you in once if you lose your"
               " phone; they are shown only now."),
        tags.ul(*[tags.li(tags.code(code)) for code in form.recovery_codes]),
        tags.form(method="post", action=action)(
            tags.label(for_="code")("3. Enter the code your app shows now"),
            tags.input(type="text", id="code", name="code", inputmode="numeric", autocomplete="one-time-code",
                       required="", **described_by(bool(form.message)), **({"autofocus": ""} if form.message else {})),
            tags.input(type="hidden", name="sealed", value=form.sealed),
            *[tags.input(type="hidden", name=name, value=value) for name, value in form.fields],
            tags.div(class_="row")(
                tags.button(type="submit", name="action", value="confirm", class_="primary")("Turn on"),
                *later,
            ),
        ),
        *recovery,
        form_origin=form.client_origin,
    )


def recovery_codes_page(request, action: str, codes: RecoveryCodes) -> bytes:
    """
    New recovery codes, shown once: the old ones no longer work. Opened
    again, the page says so and offers another set, which C{action} makes.
    """
    if not codes.codes:
        return render_page(
            request,
            200,
            "Recovery codes shown already",
            tags.p("Your new recovery codes were shown once, when you asked for them; this service does not keep"
                   " them, so they cannot be shown again. They still work."),
            tags.p("If you did not keep them, get another set: the codes shown before then stop working."),
            tags.form(method="post", action=action)(
                tags.input(type="hidden", name="csrf", value=codes.csrf),
                tags.button(type="submit")("Get new recovery codes"),
            ),
            tags.p(tags.a(href=action.rsplit("/", 2)[0])("Back to your account")),
        )
    return render_page(
        request,
        200,
        "New recovery codes",
        tags.p("Your earlier recovery codes no longer work. Keep these somewhere safe; each signs you in"
               " once, and they are shown only now."),
        tags.ul(*[tags.li(tags.code(code)) for code in codes.codes]),
        tags.p(tags.a(href=action.rsplit("/", 2)[0])("Back to your account")),
    )


def consent_page(request, action: str, form: ConsentForm) -> bytes:
    """Names the client and what it asks for, with approve and deny buttons."""
    name = form.client_name
    return render_page(
        request,
        200,
        f"Allow {name}?",
        tags.p(tags.strong(name), " asks for:"),
        tags.p(class_="warning")(
            "This application registered itself: this service has not checked who runs it. Allow it only if you"
            " started it and trust ", tags.strong(form.client_origin), ", where your answer is sent."
        ) if form.unvetted else "",
        tags.ul(*[tags.li(scope_words(s, name)) for s in form.scope]),
        tags.p(tags.small("Signed in as ", form.user_label)),
        tags.form(method="post", action=action)(
            *_hidden(form.interaction_id, form.csrf),
            tags.div(class_="row")(
                tags.button(type="submit", name="action", value="approve", class_="primary")("Allow"),
                tags.button(type="submit", name="action", value="deny")("Deny"),
            ),
        ),
        form_origin=form.client_origin,
    )


def logout_confirmation_page(request, action: str, confirmation: LogoutConfirmation) -> bytes:
    """Asks before signing out a session the application's request did not name."""
    return render_page(
        request,
        200,
        "Sign out?",
        tags.p(tags.strong(confirmation.client_name), " asks to sign you out of this service."),
        tags.form(method="post", action=action)(
            *[tags.input(type="hidden", name=name, value=value) for name, value in confirmation.fields],
            tags.input(type="hidden", name="csrf", value=confirmation.csrf),
            tags.input(type="hidden", name="confirm", value="yes"),
            tags.button(type="submit", class_="primary")("Sign out"),
        ),
        form_origin=confirmation.client_origin,
    )
