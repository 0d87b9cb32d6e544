"""
The device verification pages (RFC 8628 section 3.3): the form asking for
the code a device shows, and the approval form naming the client and its
scopes, built on L{authsrv.web.pages.render_page} like the consent page.
"""

from __future__ import annotations

from twisted.web.template import tags

from authsrv.flows.outcomes import DeviceCodeForm, DeviceConsent
from authsrv.web.interaction_pages import described_by, error_message, scope_words
from authsrv.web.pages import render_page


def device_code_page(request, action: str, form: DeviceCodeForm) -> bytes:
    """Asks for the code; a plain GET form, so the page and verification_uri_complete are one."""
    if form.retry_after is not None:
        request.setHeader(b"retry-after", str(form.retry_after).encode())
    return render_page(
        request,
        form.status,
        "Connect a device",
        tags.p("Enter the code your TV, console or command-line tool shows."),
        *error_message(form.message),
        tags.form(method="get", action=action)(
            tags.label(for_="user_code")("Code"),
            tags.input(type="text", id="user_code", name="user_code", value=form.user_code, required="",
                       autocomplete="off", autocapitalize="characters", spellcheck="false", autofocus="",
                       maxlength="16", placeholder="BCDF-GHJK", **described_by(bool(form.message))),
            tags.button(type="submit", class_="primary")("Continue"),
        ),
    )


def device_consent_page(request, action: str, form: DeviceConsent) -> bytes:
    """The code to compare, the client and what it asks for, with allow and deny buttons."""
    name = form.client_name
    return render_page(
        request,
        200,
        f"Allow {name} on your device?",
        tags.p("Check that your device shows this code: ", tags.strong(form.user_code)),
        tags.p(tags.strong(name), " asks for:"),
        tags.ul(*[tags.li(scope_words(s, name)) for s in form.scope]) if form.scope
        else tags.p("No information about you, only access for the device."),
        tags.p(tags.small("Signed in as ", form.user_label)),
        tags.form(method="post", action=action)(
            tags.input(type="hidden", name="user_code", value=form.user_code),
            tags.input(type="hidden", name="csrf", value=form.csrf),
            tags.div(class_="row")(
                tags.button(type="submit", name="action", value="approve", class_="primary")("Allow"),
                tags.button(type="submit", name="action", value="deny")("Deny"),
            ),
        ),
    )
