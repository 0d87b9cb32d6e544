"""
The login, consent and sign-out confirmation pages: plain forms that work
without JavaScript, built on L{authsrv.web.pages.render_page} (escaping, no
framing, no caching).
"""

from __future__ import annotations

from twisted.web.template import tags

from authsrv.flows.outcomes import ConsentForm, LoginForm, LogoutConfirmation
from authsrv.web.pages import render_page


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


def login_page(request, action: str, form: LoginForm) -> bytes:
    """The sign-in form; its C{message} says why it is shown again."""
    if form.retry_after is not None:
        request.setHeader(b"retry-after", str(form.retry_after).encode())
    return render_page(
        request,
        form.status,
        "Sign in",
        tags.p("to continue to ", tags.strong(form.client_name)),
        *([tags.p(class_="error", role="alert")(form.message)] if form.message else []),
        tags.form(method="post", action=action)(
            tags.label(for_="username")("Username"),
            tags.input(type="text", id="username", name="username", value=form.username, required="",
                       autocomplete="username", autocapitalize="none", spellcheck="false",
                       autofocus=""),
            tags.label(for_="password")("Password"),
            tags.input(type="password", id="password", name="password", required="",
                       autocomplete="current-password"),
            *_hidden(form.interaction_id, form.csrf),
            tags.button(type="submit", class_="primary")("Sign in"),
        ),
        form_origin=form.client_origin,
    )


def consent_page(request, action: str, form: ConsentForm) -> bytes:
    """Names the client and what it asks for, with approve and deny buttons."""
    name = form.client_name
    return render_page(
        request,
        200,
        f"Allow {name}?",
        tags.p(tags.strong(name), " asks for:"),
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
