"""
Server-rendered HTML pages: no external assets, readable on a phone, and
never framed (docs/design.md, Browser pages). Built with twisted.web.template
tags, which escape every text and attribute. The only JavaScript is the
passkey script (L{PASSKEY_SCRIPT}), inline where a page offers passkeys, and
the submit guard (L{SUBMIT_SCRIPT}) on every page, each allowed by its hash
alone; every page works without them.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import secrets
from collections.abc import Callable
from importlib import resources

from twisted.web.template import Tag, flattenString, tags

from authsrv.protocol.urls import csp_source

STYLE = """
:root{color-scheme:light dark;font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif}
body{margin:0;display:flex;justify-content:center;padding:2rem 1rem;line-height:1.5}
main{width:100%;max-width:24rem;overflow-wrap:anywhere}
h1{font-size:1.4rem;margin:0 0 1rem}
h2{font-size:1.1rem;margin:1.6rem 0 .4rem}
label{display:block;margin:.8rem 0 .2rem;font-weight:600}
input[type=text],input[type=password]{width:100%;box-sizing:border-box;padding:.6rem;font-size:1rem;
border:1px solid #888;border-radius:.4rem}
button{margin-top:1.2rem;padding:.6rem 1.2rem;font-size:1rem;border-radius:.4rem;border:1px solid #555;cursor:pointer}
button.primary{background:#1f5fbf;color:#fff;border-color:#1f5fbf}
.row{display:flex;gap:.6rem;flex-wrap:wrap}
.error{padding:.6rem .8rem;border-radius:.4rem;background:#fde8e8;color:#8a1c1c}
.notice{padding:.6rem .8rem;border-radius:.4rem;background:#e6f4ea;color:#14532d}
ul{padding-left:1.2rem}
small{opacity:.8}
""".strip()


def _script(name: str) -> str:
    return resources.files("authsrv.web").joinpath(name).read_text("utf-8")


PASSKEY_SCRIPT = _script("passkey.js")
"""
The browser's own WebAuthn call (navigator.credentials) for the forms marked
C{data-passkey}; written without C{<}, C{>} or C{&}, which the page's
escaping would change and so break its hash.
"""

SUBMIT_SCRIPT = _script("submit.js")
"""
Lets a page send one form: a double click on "Sign in" or "Allow" would
post the form again, and the second post finds its sign-in used up by the
first and shows an error while the first one's answer is dropped. Written
as L{PASSKEY_SCRIPT} is.
"""


def _hash(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; style-src 'sha256-{_hash(STYLE)}'; script-src 'sha256-{_hash(PASSKEY_SCRIPT)}'"
    f" 'sha256-{_hash(SUBMIT_SCRIPT)}';"
    " img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def page_headers(request, form_origin: str | None = None) -> None:
    """
    The headers every HTML page carries. Browsers apply form-action to the
    redirects that follow a form's submission too, so a page whose form
    ends at a client (login, consent, sign-out) names that client's origin.
    """
    policy = CONTENT_SECURITY_POLICY if form_origin is None else f"{CONTENT_SECURITY_POLICY} {csp_source(form_origin)}"
    request.setHeader(b"content-type", b"text/html; charset=utf-8")
    request.setHeader(b"x-frame-options", b"DENY")
    request.setHeader(b"content-security-policy", policy.encode())
    request.setHeader(b"x-content-type-options", b"nosniff")
    request.setHeader(b"referrer-policy", b"no-referrer")
    request.setHeader(b"cache-control", b"no-store")


def render_page(request, status: int, title: str, *content, form_origin: str | None = None) -> bytes:
    """A complete page; C{content} are twisted.web.template tags or text."""
    request.setResponseCode(status)
    page_headers(request, form_origin)
    return _document(title, content)


def _document(title: str, content: tuple) -> bytes:
    document = tags.html(lang="en")(
        tags.head(
            tags.meta(charset="utf-8"),
            tags.meta(name="viewport", content="width=device-width, initial-scale=1"),
            tags.meta(name="robots", content="noindex"),
            tags.title(title),
            tags.style(STYLE),
        ),
        tags.body(Tag("main")(tags.h1(title), *content), tags.script(SUBMIT_SCRIPT)),
    )
    results: list = []
    flattenString(None, document).addBoth(results.append)
    return b"<!DOCTYPE html>\n" + results[0]


class PreparedPage:
    """
    A page of one shape, flattened once by L{render_page}'s templates with a
    marker in place of each text that varies; a render escapes the texts as
    twisted.web.template does (C{"} too inside an attribute) and joins them
    with the prepared bytes. The same page, without walking its tags on
    every request: the login page is shown once in every sign-in.
    """

    def __init__(self, title: str, build: Callable[[Callable[[str], str]], tuple]):
        """C{build(field)} returns the content, with C{field(name)} wherever the text C{name} goes."""
        marks: dict[bytes, str] = {}

        def field(name: str) -> str:
            mark = f"field-{secrets.token_hex(8)}"
            marks[mark.encode()] = name
            return mark

        page = _document(title, build(field))
        self._static: list[bytes] = []
        self._fields: list[tuple[str, bool]] = []
        start = 0
        for found in re.finditer(b"|".join(marks), page):
            at = found.start()
            self._static.append(page[start:at])
            self._fields.append((marks[found.group()], page.rfind(b"<", 0, at) > page.rfind(b">", 0, at)))
            start = found.end()
        self._static.append(page[start:])

    def render(self, request, status: int, form_origin: str | None = None, **texts: str) -> bytes:
        request.setResponseCode(status)
        page_headers(request, form_origin)
        out = [self._static[0]]
        for (name, in_attribute), after in zip(self._fields, self._static[1:]):
            text = html.escape(texts[name], quote=False)
            out += ((text.replace('"', "&quot;") if in_attribute else text).encode(), after)
        return b"".join(out)


def error_page(request, status: int, title: str, message: str) -> bytes:
    """A page for errors that must not go back to the client (an unknown client, a bad redirect URI)."""
    return render_page(request, status, title, tags.p(class_="error")(message))


def passkey_script():
    """The passkey script, for a page with a C{data-passkey} form (after the form)."""
    return tags.script(PASSKEY_SCRIPT)
