"""
The login and consent pages: plain forms that work without JavaScript, built
on L{authsrv.web.pages.render_page} (escaping, no framing, no caching).
"""

from __future__ import annotations

from twisted.web.template import tags

from authsrv.web.pages import render_page

INCORRECT = "The username or password is incorrect."
MISSING = "Enter your username and password."
UNAVAILABLE = "Signing in is not possible right now; please try again later."
FORM_EXPIRED = "This form expired or was not sent by this site; start again from the application."
TOO_LONG = "The sign-in took too long and has expired; start again from the application."
SIGNED_OUT = "You are no longer signed in; start again from the application."


def too_many_attempts(retry_after: int) -> str:
    minutes = max(1, -(-retry_after // 60))
    return f"Too many attempts; try again in {minutes} minute{'s' if minutes != 1 else ''}."


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


def login_page(request, status: int, *, action: str, client_name: str, request_id: str, csrf: str,
               username: str = "", message: str | None = None) -> bytes:
    """The sign-in form; C{message} says why it is shown again."""
    return render_page(
        request,
        status,
        "Sign in",
        tags.p("to continue to ", tags.strong(client_name)),
        *([tags.p(class_="error", role="alert")(message)] if message else []),
        tags.form(method="post", action=action)(
            tags.label(for_="username")("Username"),
            tags.input(type="text", id="username", name="username", value=username, required="",
                       autocomplete="username", autocapitalize="none", spellcheck="false",
                       autofocus=""),
            tags.label(for_="password")("Password"),
            tags.input(type="password", id="password", name="password", required="",
                       autocomplete="current-password"),
            *_hidden(request_id, csrf),
            tags.button(type="submit", class_="primary")("Sign in"),
        ),
    )


def consent_page(request, status: int, *, action: str, client_name: str, user_label: str,
                 scope: tuple[str, ...], request_id: str, csrf: str) -> bytes:
    """Names the client and what it asks for, with approve and deny buttons."""
    return render_page(
        request,
        status,
        f"Allow {client_name}?",
        tags.p(tags.strong(client_name), " asks for:"),
        tags.ul(*[tags.li(scope_words(s, client_name)) for s in scope]),
        tags.p(tags.small("Signed in as ", user_label)),
        tags.form(method="post", action=action)(
            *_hidden(request_id, csrf),
            tags.div(class_="row")(
                tags.button(type="submit", name="action", value="approve", class_="primary")("Allow"),
                tags.button(type="submit", name="action", value="deny")("Deny"),
            ),
        ),
    )
