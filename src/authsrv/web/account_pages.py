"""
The account page: the signed-in user's browsers, connected applications,
chat link, second factors and password, each with its own small form
(server-rendered, every form CSRF-protected by a token bound to the session
cookie). Adding a passkey is the one step that needs the browser's
JavaScript (L{authsrv.web.pages.passkey_script}); without it the rest works.
"""

from __future__ import annotations

from datetime import datetime, timezone

from twisted.web.template import tags

from authsrv.flows.account import AccountView, PasswordRefused
from authsrv.web.interaction_pages import described_by, error_message, scope_words
from authsrv.web.pages import passkey_script, render_page


def when(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%d %b %Y %H:%M UTC")


def _post(action: str, csrf: str, label: str, **fields):
    return tags.form(method="post", action=action)(
        tags.input(type="hidden", name="csrf", value=csrf),
        *[tags.input(type="hidden", name=name, value=value) for name, value in fields.items()],
        tags.button(type="submit")(label),
    )


def _scope(scope: str, name: str) -> str:
    try:
        return scope_words(scope, name)
    except KeyError:
        return scope


def account_page(request, base: str, view: AccountView, *, link_path: str, status: int = 200) -> bytes:
    """The whole account page; C{base} is its own URL, the forms post below it."""
    sections = [tags.p("Signed in as ", tags.strong(view.user_label))]
    refused = isinstance(view.message, PasswordRefused)
    if view.message and not refused:
        sections.append(tags.p(class_="notice", role="status")(view.message))
    sections += [tags.h2("Signed-in browsers"), tags.ul(*[
        tags.li(tags.strong(row.device), tags.br(), tags.small(
            row.address or "unknown address", " · signed in ", when(row.signed_in),
            " · last seen ", when(row.last_seen)),
            tags.br(), tags.em("This browser") if row.current else
            _post(f"{base}/sessions/end", view.csrf, "Sign out", sid=row.sid))
        for row in view.sessions
    ])]
    sections.append(tags.h2("Connected applications"))
    if view.apps:
        sections.append(tags.ul(*[
            tags.li(tags.strong(app.name), tags.br(),
                    tags.small(", ".join(_scope(s, app.name) for s in app.scope) or "no data",
                               " · since ", when(app.since)),
                    _post(f"{base}/apps/revoke", view.csrf, "Revoke access", client_id=app.client_id))
            for app in view.apps
        ]))
    else:
        sections.append(tags.p("No application has access to your account."))
    if view.chat_provider:
        sections.append(tags.h2("Chat account"))
        if view.chat_account and view.chat_unlink_csrf:
            sections += [tags.p("Your ", view.chat_provider, " account ", tags.strong(view.chat_account),
                                " is linked."),
                         _post(f"{link_path}/unlink", view.chat_unlink_csrf, "Unlink")]
        else:
            sections.append(tags.p(tags.a(href=link_path)(f"Link your {view.chat_provider} account")))
    if view.factors_enabled:
        sections += _factors(base, view)
    if view.can_change_password:
        sections += [tags.h2("Password"), *error_message(view.message if refused else None),
                     _password_form(f"{base}/password", view, refused)]
    return render_page(request, status, "Your account", *sections)


def _password_form(action: str, view: AccountView, refused: bool):
    """
    The password change, its fields read with the refusal shown above it
    and the cursor in the first; the hidden user name tells a password
    manager whose password changes.
    """
    described = described_by(refused)
    return tags.form(method="post", action=action)(
        tags.input(type="hidden", name="csrf", value=view.csrf),
        tags.input(type="text", name="username", value=view.user_label, autocomplete="username", hidden="",
                   readonly=""),
        tags.label(for_="current_password")("Current password"),
        tags.input(type="password", id="current_password", name="current_password", required="",
                   autocomplete="current-password", **described, **({"autofocus": ""} if refused else {})),
        tags.label(for_="new_password")("New password"),
        tags.input(type="password", id="new_password", name="new_password", required="",
                   autocomplete="new-password", **described),
        tags.label(for_="new_password_again")("New password again"),
        tags.input(type="password", id="new_password_again", name="new_password_again", required="",
                   autocomplete="new-password", **described),
        tags.button(type="submit")("Change password"),
        tags.p(tags.small("Your other browsers are signed out.")),
    )


def _factors(base: str, view: AccountView) -> list:
    sections = [tags.h2("Two-step sign-in"),
                tags.p("Authenticator app: ", tags.strong("on" if view.totp else "off"), " · ",
                       tags.a(href=f"{base}/mfa/totp")("Replace" if view.totp else "Set up")),
                ]
    if view.recovery_left is not None:
        sections.append(tags.p(f"Recovery codes left: {view.recovery_left}"))
    sections.append(tags.h2("Passkeys"))
    if view.passkeys:
        sections.append(tags.ul(*[
            tags.li(tags.strong("Synced passkey" if p.backup_eligible else "Device-bound passkey"), tags.br(),
                    tags.small("added ", when(p.created_at), " · last used ",
                               when(p.last_used) if p.last_used else "never"),
                    _post(f"{base}/passkeys/remove", view.passkey_csrf, "Remove", credential_id=p.credential_id)
                    if view.passkey_csrf else "")
            for p in view.passkeys
        ]))
    else:
        sections.append(tags.p("No passkeys yet."))
    if view.passkey_csrf and view.passkey_options:
        sections += [
            tags.form(method="post", action=f"{base}/passkeys", hidden="", id="add-passkey",
                      **{"data-passkey": "create", "data-options": view.passkey_options})(
                tags.input(type="hidden", name="csrf", value=view.passkey_csrf),
                tags.input(type="hidden", name="credential", value=""),
                tags.button(type="submit", class_="primary")("Add a passkey"),
                tags.p(role="status"),
            ),
            passkey_script(),
        ]
    elif not view.passkey_csrf:
        sections.append(tags.p(tags.a(href=f"{base}/sign-in")("Sign in again"),
                               " to change your factors: that needs a recent sign-in, with your second factor"
                               " if you have one."))
    elif view.passkeys_full:
        sections.append(tags.p(view.passkeys_full))
    return sections
