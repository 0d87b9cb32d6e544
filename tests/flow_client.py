"""
A user agent for flow tests over L{harness.Harness}: it keeps the service's
cookies, reads the login and consent forms and submits them as a browser
would, so tests speak of what a user does.
"""

from __future__ import annotations

import html
import re
from http.cookiejar import CookieJar
from http.cookies import SimpleCookie
from urllib.parse import urlsplit
from weakref import WeakKeyDictionary

from treq.client import HTTPClient
from treq.testing import RequestTraversalAgent, _SynchronousProducer
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import blockingCallFromThread, deferToThread

from harness import BASE, ISSUER, Harness, query_of, settle

from authsrv.testing.identity import PASSWORDS
from authsrv.tokens import token_hash

_INPUT = re.compile(r"<input [^>]*>")
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def hidden_fields(body: bytes) -> dict[str, str]:
    """The hidden inputs of a page's form, by name."""
    fields = {}
    for tag in _INPUT.findall(body.decode()):
        attrs = {k: html.unescape(v) for k, v in _ATTR.findall(tag)}
        if attrs.get("type") == "hidden":
            fields[attrs["name"]] = attrs["value"]
    return fields


def shows_login_form(response, body: bytes) -> bool:
    """The answer is the login form itself (as an authorization request that needs a login answers)."""
    return response.code == 200 and b'name="password"' in body


def login_url(body: bytes) -> str:
    """Where the login form in C{body} is shown again: the page of its own waiting request."""
    return f"{ISSUER}/login?request={hidden_fields(body)['request']}"


def location(response) -> str:
    return response.headers.getRawHeaders(b"location")[0].decode()


def local(url: str) -> str:
    """A URL of the service as a path on the harness's host (the issuer may be https)."""
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


class Browser:
    """
    One browser: its own cookies (name to value, sent whatever their flags)
    and its own client, since StubTreq's cookie jar is shared by every
    request through it and two browsers must be two devices.
    """

    def __init__(self, harness: Harness):
        self.h = harness
        self.cookies: dict[str, str] = {}
        self.set_cookie_headers: list[str] = []
        self._agent = RequestTraversalAgent(harness.root)
        self._jar = CookieJar()
        self._client = HTTPClient(self._agent, cookiejar=self._jar, data_to_body_producer=_SynchronousProducer)
        self._bodies: WeakKeyDictionary = WeakKeyDictionary()

    def _keep(self, response) -> None:
        for header in response.headers.getRawHeaders(b"set-cookie", []):
            text = header.decode()
            self.set_cookie_headers.append(text)
            for name, morsel in SimpleCookie(text).items():
                if morsel["max-age"] == "0":
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value

    async def _settle(self, d):
        return await settle(self._agent, d)

    async def request(self, method: str, url: str, **kwargs):
        """(response, body) of a request to the service with this browser's cookies; no redirect followed."""
        self._jar.clear()
        d = self._client.request(method, BASE + local(url), cookies=dict(self.cookies),
                                 allow_redirects=False, **kwargs)
        response = await self._settle(d)
        body = await self._settle(response.content())
        self._keep(response)
        self._bodies[response] = body
        return response, body

    async def get(self, url: str):
        return await self.request("GET", url)

    async def post(self, url: str, data: dict):
        return await self.request("POST", url, data=data)

    @property
    def session_hash(self) -> str | None:
        value = self.cookies.get("authsrv_session")
        return token_hash(value) if value else None

    async def authorize(self, client_id="first", **params):
        return await self.get(self.h.authorize_url(client_id, **params))

    async def login_page(self, led_there):
        """
        (response, body) of the login page C{led_there}: an answer of this
        browser that is the page itself (an authorization request's) or a
        redirect to it (the device flow's), or the page's URL.
        """
        if isinstance(led_there, str):
            return await self.get(led_there)
        if led_there.code in (302, 303):
            return await self.get(location(led_there))
        return led_there, self._bodies[led_there]

    async def submit_login(self, led_there, login: str, password: str, **overrides):
        """Submit the login page L{login_page} finds; C{overrides} replace form fields."""
        response, body = await self.login_page(led_there)
        assert response.code == 200, body
        fields = {**hidden_fields(body), "username": login, "password": password, **overrides}
        return await self.post(ISSUER + "/login", {k: v for k, v in fields.items() if v is not None})

    async def answer_consent(self, page_url: str, action: str, **overrides):
        response, body = await self.get(page_url)
        assert response.code == 200, body
        fields = {**hidden_fields(body), "action": action, **overrides}
        return await self.post(ISSUER + "/consent", {k: v for k, v in fields.items() if v is not None})

    async def sign_in(self, user, client_id="first", consent="approve", **params) -> dict[str, str]:
        """
        The whole front channel as a user goes through it: authorize, log in
        if asked, consent if asked; the query of the redirect to the client.
        """
        response, body = await self.authorize(client_id, **params)
        if shows_login_form(response, body):
            response, body = await self.submit_login(response, user.login, PASSWORDS[user.sub])
        if response.code == 303 and "/consent?" in location(response):
            response, body = await self.answer_consent(location(response), consent)
        assert response.code in (302, 303), (response.code, body)
        return query_of(location(response))


def on_reactor(make_coroutine):
    """
    From a worker thread (where Hypothesis runs, see L{fuzz}): run a
    coroutine on the reactor and wait for its result.
    """
    return blockingCallFromThread(reactor, lambda: ensureDeferred(make_coroutine()))


async def fuzz(check) -> None:
    """
    Run a Hypothesis test off the reactor thread, so that each example can
    wait for the in-memory server (L{on_reactor}) while the reactor runs.
    """
    await deferToThread(check)
