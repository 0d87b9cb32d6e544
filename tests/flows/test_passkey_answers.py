"""
Passkey answers through the in-memory server, made by a software
authenticator (tests/soft_passkey.py) so that they may say what a browser's
would not: whatever the library refuses is "not accepted" or "could not be
added", never a server error; a used, replayed or counted-back assertion is
refused.
"""

from __future__ import annotations

import json
import re
from html import unescape

import cbor2
import pytest
import pytest_twisted

from flow_client import Browser, hidden_fields, location
from harness import BASE, ISSUER, Harness
from soft_passkey import AT, BE, BS, UP, UV, SoftPasskey

from authsrv.flows.passkeys import MAX_PASSKEYS, PasskeyAccepted, Passkeys, browser_origin
from authsrv.records import Passkey
from authsrv.testing.identity import ALICE
from authsrv.testing.memory import MemoryStore

ACCOUNT = ISSUER + "/account"
_OPTIONS = re.compile(r'data-options="([^"]+)"')
NOT_ADDED = b"The passkey could not be added."
NOT_ACCEPTED = b"That passkey was not accepted."
FULL = b"the most an account keeps. Remove one to add another."
NOW = 1_900_000_000


def options_of(body: bytes) -> str:
    return unescape(_OPTIONS.search(body.decode()).group(1))


async def add_passkey(browser: Browser, make) -> bytes:
    """
    Post the answer C{make} builds from the account page's fresh creation
    options; the page the answer's 303 sends the browser to.
    """
    response, body = await browser.get(ACCOUNT)
    assert response.code == 200, body
    csrf = hidden_fields(body.split(b'id="add-passkey"')[1].split(b"</form>")[0])["csrf"]
    response, body = await browser.post(ACCOUNT + "/passkeys", {"csrf": csrf, "credential": make(options_of(body))})
    assert response.code == 303 and location(response).startswith(ACCOUNT + "?done=passkey-"), body
    response, body = await browser.get(location(response))
    assert response.code == 200, body
    return body


async def sign_in_with(h: Harness, make):
    """A new browser's sign-in by the passkey answer C{make} builds from the login page's options."""
    browser = Browser(h)
    response, body = await browser.authorize("first")
    assert response.code == 200, body
    fields = {**hidden_fields(body), "credential": make(options_of(body))}
    return await browser.post(ISSUER + "/login/passkey", fields)


@pytest_twisted.ensureDeferred
async def test_odd_registrations_are_refused_not_a_server_error(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        key = SoftPasskey("127.0.0.1", BASE, ALICE.sub.encode())
        odd = (
            lambda options: key.create(options, flags=UP | UV | AT | BS),
            lambda options: key.create(options, cose_key=cbor2.dumps({3: -7})),
            lambda options: key.create(options, cose_key=cbor2.dumps({1: 99, 3: -7})),
        )
        for make in odd:
            assert NOT_ADDED in await add_passkey(browser, make)
        assert await h.store.list_passkeys(ALICE.sub) == []
        assert b"Your passkey is added." in await add_passkey(browser, key.create)
    finally:
        await h.close()


@pytest.mark.parametrize("configured", [None, 2], ids=["default", "max_passkeys"])
@pytest_twisted.ensureDeferred
async def test_a_user_keeps_at_most_their_cap_of_passkeys_and_the_page_says_so(tmp_path, monkeypatch, configured):
    """
    Every passkey is a row, listed at each sign-in naming the user: one more
    than the cap ([mfa] max_passkeys, MAX_PASSKEYS by default) is refused
    with a message naming it, even when its options were fetched before the
    cap was reached, and the page stops offering to add.
    """
    cap = configured or MAX_PASSKEYS
    h = await Harness(tmp_path, monkeypatch, {"mfa": {"max_passkeys": configured}} if configured else None).start()
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        first = SoftPasskey("127.0.0.1", BASE, ALICE.sub.encode())
        await add_passkey(browser, first.create)
        for n in range(cap - 2):
            await h.store.add_passkey(Passkey(f"cred-{n}", ALICE.sub, b"cose-key", 1, False, False, (), h.now()))
        browser = Browser(h)
        response, body = await browser.authorize("first")
        response, body = await browser.post(ISSUER + "/login/passkey",
                                            {**hidden_fields(body), "credential": first.get(options_of(body))})
        assert response.code == 303 and "code=" in location(response), body
        response, body = await browser.get(ACCOUNT)
        late = SoftPasskey("127.0.0.1", BASE, ALICE.sub.encode()).create(options_of(body))
        last = SoftPasskey("127.0.0.1", BASE, ALICE.sub.encode())
        assert b"Your passkey is added." in await add_passkey(browser, last.create)
        response, body = await browser.get(ACCOUNT)
        full = b"You have %d passkeys, " % cap + FULL
        assert response.code == 200 and full in body and b'id="add-passkey"' not in body
        csrf = hidden_fields(body.split(b"/passkeys/remove")[1].split(b"</form>")[0])["csrf"]
        response, body = await browser.post(ACCOUNT + "/passkeys", {"csrf": csrf, "credential": late})
        assert (response.code, location(response)) == (303, ACCOUNT + "?done=passkey-limit"), body
        response, body = await browser.get(location(response))
        assert response.code == 200 and full in body, body
        assert len(await h.store.list_passkeys(ALICE.sub)) == cap
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_odd_replayed_or_counted_back_assertions_are_refused(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        key = SoftPasskey("127.0.0.1", BASE, ALICE.sub.encode())
        await add_passkey(browser, lambda options: key.create(options, flags=UP | UV | AT | BE))
        response, body = await sign_in_with(h, lambda options: key.get(options, flags=UP | UV | BS))
        assert response.code == 200 and NOT_ACCEPTED in body, "backed up, yet not backup-eligible"
        answers = []
        response, body = await sign_in_with(h, lambda options: answers.append(key.get(options)) or answers[-1])
        assert response.code == 303 and "code=" in location(response), body
        browser = Browser(h)
        response, body = await browser.authorize("first")
        response, body = await browser.post(ISSUER + "/login/passkey", {**hidden_fields(body), "credential": answers[0]})
        assert response.code == 200 and NOT_ACCEPTED in body, "an answer to another sign-in's challenge"
        response, body = await sign_in_with(h, lambda options: key.get(options, count=key.count))
        assert response.code == 200 and NOT_ACCEPTED in body, "a counter that did not grow"
        response, body = await sign_in_with(h, lambda options: key.get(options, flags=UP | UV | BE))
        assert response.code == 303, body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_public_url_with_its_default_port_or_capitals_still_matches_the_browsers_origin():
    """
    Browsers write the origin in lower case without a default port: a
    public URL written otherwise made every passkey answer a wrong origin.
    """
    for public_url, expected in (("https://ID.Example.test:443/auth", "https://id.example.test"),
                                 ("http://LocalHost:8080", "http://localhost:8080"),
                                 ("http://[::1]:80", "http://[::1]")):
        assert browser_origin(public_url) == expected
    keys = Passkeys(store=MemoryStore(), public_url="https://ID.Example.test:443", rp_name="Example")
    key = SoftPasskey("id.example.test", "https://id.example.test", b"sub-1")
    options = await keys.registration_options("sub-1", "alice", "Alice", NOW)
    assert await keys.register("sub-1", key.create(options), NOW, "192.0.2.1") is not None
    outcome = await keys.authenticate("i-1", key.get(await keys.sign_in_options("i-1", NOW)), "192.0.2.1", NOW)
    assert isinstance(outcome, PasskeyAccepted) and outcome.passkey.sub == "sub-1"


@pytest_twisted.ensureDeferred
async def test_only_transport_names_are_kept_with_a_passkey(tmp_path, monkeypatch, pg_dsn):
    """Any text as a transport was stored: one holding NUL, which PostgreSQL refuses, answered 500."""
    h = await Harness(tmp_path, monkeypatch, postgres_dsn=pg_dsn).start()
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        key = SoftPasskey("127.0.0.1", BASE, ALICE.sub.encode())

        def odd_transports(options):
            credential = json.loads(key.create(options))
            credential["response"]["transports"] = ["internal", "int\0ernal", "x" * 500, 5, None, "hybrid"]
            return json.dumps(credential)

        assert b"Your passkey is added." in await add_passkey(browser, odd_transports)
        [passkey] = await h.store.list_passkeys(ALICE.sub)
        assert passkey.transports == ("internal", "hybrid")
    finally:
        await h.close()


def padded(answer: str, size: int) -> str:
    """A passkey answer grown to about C{size} characters by an extension output, as a browser may add."""
    parsed = json.loads(answer)
    parsed["clientExtensionResults"] = {"pad": "x" * (size - len(answer))}
    return json.dumps(parsed)


@pytest_twisted.ensureDeferred
async def test_an_answer_over_a_form_fields_cap_is_read_up_to_the_passkeys_own(tmp_path, monkeypatch):
    """
    Every field of a page's form was capped at 8192 characters, so an
    answer longer than that (within MAX_CREDENTIAL_JSON, 16384) made the
    form unreadable: the page of a form expired. It is read, and checked.
    """
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        key = SoftPasskey("127.0.0.1", BASE, ALICE.sub.encode())
        assert b"Your passkey is added." in await add_passkey(browser, lambda options: padded(key.create(options),
                                                                                              10_000))
        response, body = await sign_in_with(h, lambda options: padded(key.get(options), 12_000))
        assert response.code == 303 and "code=" in location(response), body
        response, body = await sign_in_with(h, lambda options: padded(key.get(options), 17_000))
        assert response.code == 200 and NOT_ACCEPTED in body, body
    finally:
        await h.close()
