"""
Back-channel logout (OIDC Back-Channel Logout 1.0): a fake relying party,
served in memory by StubTreq, records what the server posts to it. Time is
a Clock: retries and timeouts happen only when a test advances it.
"""

from __future__ import annotations

import base64
import json
from urllib.parse import parse_qs

import attrs
import pytest
import pytest_twisted
from jwcrypto.jwk import JWKSet
from jwcrypto.jwt import JWT
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, deferLater
from twisted.logger import globalLogPublisher
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from authsrv.embedded import prepare_data_dir
from authsrv.flows import backchannel
from authsrv.flows.backchannel import LOGOUT_EVENT, BackchannelNotifier
from authsrv.records import BrowserSession, Client
from authsrv.store import sqlite
from authsrv.testing.identity import ALICE, BOB
from authsrv.testing.memory import MemoryStore
from authsrv.testing.store import start_grant
from authsrv.tokens import new_token, token_hash

from conftest import admin
from flow_client import Browser
from harness import CLIENTS, ISSUER, Harness

END_SESSION = ISSUER + "/oauth2/end-session"
FIRST_URI = "http://127.0.0.1:9000/backchannel"
PARTNER_URI = "http://127.0.0.1:9001/backchannel"
HANG = "hang"


class FakeRelyingParty(Resource):
    """
    Records every logout POST; answers each with the next of C{answers}
    (a status, or L{HANG} to hold the request in C{held}), 200 when none
    are left.
    """

    isLeaf = True

    def __init__(self, answers=()):
        super().__init__()
        self.answers = list(answers)
        self.received: list[dict] = []
        self.held = []
        self.http = StubTreq(self)

    def render_POST(self, request):
        self.received.append(
            {
                "url": request.getHeader(b"host").decode() + request.path.decode(),
                "content_type": request.getHeader(b"content-type"),
                "form": parse_qs(request.content.read().decode()),
            }
        )
        answer = self.answers.pop(0) if self.answers else 200
        if answer == HANG:
            self.held.append(request)
            return NOT_DONE_YET
        request.setResponseCode(answer)
        return b""

    def tokens(self) -> list[str]:
        return [r["form"]["logout_token"][0] for r in self.received]


def outcomes(audit) -> dict[str, str]:
    return {e["client_id"]: e["outcome"] for e in audit.of("logout.backchannel")}


# --- the notifier alone: retries, timeouts, bounds --------------------------------


def deliver(answers):
    """A delivery to a fake RP on a Clock; returns (clock, rp, Deferred of the outcome)."""
    clock = Clock()
    rp = FakeRelyingParty(answers)
    notifier = BackchannelNotifier(clock, lambda address: rp.http)
    d = Deferred.fromCoroutine(notifier.deliver(FIRST_URI, "the-logout-token", "first", "sid-1"))
    rp.http.flush()
    return clock, rp, d


def test_delivered_at_first_attempt(audit):
    clock, rp, d = deliver([200])
    assert d.result == "delivered (HTTP 200) at attempt 1"
    assert rp.tokens() == ["the-logout-token"]
    assert rp.received[0]["content_type"] == b"application/x-www-form-urlencoded"
    assert rp.received[0]["form"] == {"logout_token": ["the-logout-token"]}
    assert clock.getDelayedCalls() == []
    assert outcomes(audit) == {"first": "delivered (HTTP 200) at attempt 1"}
    assert "the-logout-token" not in repr(audit)


def test_server_errors_are_retried_with_backoff_and_then_given_up(audit):
    clock, rp, d = deliver([500] * 10)
    assert len(rp.received) == 1
    clock.advance(0.99)
    assert len(rp.received) == 1
    clock.advance(0.01)
    assert len(rp.received) == 2
    clock.advance(4.99)
    assert len(rp.received) == 2
    clock.advance(0.01)
    assert len(rp.received) == 3
    assert d.result == "gave up after 3 attempts, last: HTTP 500"
    clock.advance(3600)
    assert len(rp.received) == 3
    assert clock.getDelayedCalls() == []
    assert outcomes(audit) == {"first": "gave up after 3 attempts, last: HTTP 500"}


def test_too_many_requests_and_unavailable_are_retried_until_success():
    clock, rp, d = deliver([429, 503, 204])
    clock.advance(1)
    clock.advance(5)
    assert len(rp.received) == 3
    assert rp.tokens() == ["the-logout-token"] * 3
    assert d.result == "delivered (HTTP 204) at attempt 3"


@pytest.mark.parametrize("status", [400, 401, 404, 302])
def test_a_refusal_is_final(status):
    clock, rp, d = deliver([status, 200])
    assert d.result == f"refused (HTTP {status}) at attempt 1"
    clock.advance(3600)
    assert len(rp.received) == 1


def test_an_unanswered_attempt_times_out_and_is_retried():
    clock, rp, d = deliver([HANG, HANG, 200])
    assert len(rp.received) == 1
    clock.advance(4.9)
    assert not d.called
    clock.advance(0.1)
    clock.advance(1)
    assert len(rp.received) == 2
    clock.advance(5)
    clock.advance(5)
    assert len(rp.received) == 3
    assert d.result == "delivered (HTTP 200) at attempt 3"


def test_an_unreachable_party_is_given_up():
    class Unreachable:
        def __init__(self):
            self.calls = 0

        def post(self, uri, **kwargs):
            self.calls += 1
            return Deferred.fromCoroutine(self._refuse())

        async def _refuse(self):
            raise ConnectionRefusedError()

    clock = Clock()
    http = Unreachable()
    d = Deferred.fromCoroutine(BackchannelNotifier(clock, lambda address: http).deliver(FIRST_URI, "t", "first", "sid-1"))
    clock.advance(1)
    clock.advance(5)
    assert http.calls == 3
    assert d.result == "gave up after 3 attempts, last: ConnectionRefusedError"


class SessionNamingSigner:
    """A keystore whose logout tokens name their session (their shape is checked through end-session below)."""

    algorithms = ("RS256",)

    def sign(self, claims, alg, typ):
        return f"logout-token-of-{claims['sid']}"


@pytest_twisted.ensureDeferred
async def test_settling_waits_for_deliveries_in_flight_and_cuts_off_what_outlasts_it(audit):
    """
    Ended sessions are told to their clients after the answer (a ban, the
    operator's end-sessions): a stopping server, or an operator command
    about to exit, settles the notifier, which waits for the deliveries in
    flight and, at its timeout, cuts off those still running, each reported
    so that none is lost in silence, and none keeps a timer.
    """
    clock = Clock()
    rp = FakeRelyingParty([HANG, HANG])
    store = MemoryStore()
    await store.put_client(Client("first", None, ["http://127.0.0.1:9/cb"], backchannel_logout_uri=FIRST_URI))
    for sid in ("sid-1", "sid-2"):
        await start_grant(store, f"g-{sid}", ALICE.sub, "first", sid=sid)
    notifier = BackchannelNotifier(clock, lambda address: rp.http)
    assert Deferred.fromCoroutine(notifier.settle(1)).result == 0

    for sid in ("sid-1", "sid-2"):
        notifier.session_ended(store, SessionNamingSigner(), ISSUER, BrowserSession(token_hash(sid), sid, ALICE.sub, 0, 0, 10**9))
    rp.http.flush()
    assert rp.tokens() == ["logout-token-of-sid-1", "logout-token-of-sid-2"]
    settled = Deferred.fromCoroutine(notifier.settle(3))
    rp.held[0].setResponseCode(200)
    rp.held[0].finish()
    rp.http.flush()
    clock.advance(2.9)
    assert not settled.called
    clock.advance(0.1)
    rp.http.flush()
    assert settled.result == 1
    assert [(e["session_id"], e["outcome"]) for e in audit.of("logout.backchannel")] == [
        ("sid-1", "delivered (HTTP 200) at attempt 1"),
        ("sid-2", "cut off at shutdown (attempt 1)"),
    ]
    assert clock.getDelayedCalls() == []
    clock.advance(3600)
    rp.http.flush()
    assert len(rp.received) == 2


@pytest_twisted.ensureDeferred
async def test_the_default_client_delivers_over_real_http():
    rp = FakeRelyingParty([503])
    port = reactor.listenTCP(0, Site(rp), interface="127.0.0.1")
    try:
        notifier = BackchannelNotifier(reactor, backchannel.default_http_client(reactor), retry_delays=(0.01,))
        uri = f"http://127.0.0.1:{port.getHost().port}/backchannel"
        outcome = await Deferred.fromCoroutine(notifier.deliver(uri, "the-logout-token", "first", "sid-1"))
    finally:
        await port.stopListening()
    assert outcome == "delivered (HTTP 200) at attempt 2"
    assert rp.received[1]["content_type"] == b"application/x-www-form-urlencoded"
    assert rp.received[1]["form"] == {"logout_token": ["the-logout-token"]}


@pytest_twisted.ensureDeferred
async def test_the_default_client_gives_up_on_a_closed_port():
    port = reactor.listenTCP(0, Site(FakeRelyingParty()), interface="127.0.0.1")
    closed = port.getHost().port
    await port.stopListening()
    notifier = BackchannelNotifier(reactor, backchannel.default_http_client(reactor), retry_delays=(0.01, 0.01))
    outcome = await Deferred.fromCoroutine(notifier.deliver(f"http://127.0.0.1:{closed}/", "t", "first", "sid-1"))
    assert outcome == "gave up after 3 attempts, last: ConnectionRefusedError"


# --- through end-session ------------------------------------------------------------------


def _clients() -> list[dict]:
    uris = {"first": FIRST_URI, "partner": PARTNER_URI}
    return [{**c, "backchannel_logout_uri": uris[c["client_id"]]} if c["client_id"] in uris else c for c in CLIENTS]


async def _harness(tmp_path, monkeypatch, rp: FakeRelyingParty) -> Harness:
    monkeypatch.setattr(backchannel, "default_http_client", lambda reactor: lambda address: rp.http)
    return await Harness(tmp_path, monkeypatch, {"clients": _clients()}).start()


async def _logged_in(h: Harness, sid: str = "sid-1") -> str:
    value = new_token()
    now = h.now()
    await h.store.create_session(BrowserSession(token_hash(value), sid, ALICE.sub, now, now, now + 86400))
    return value


async def _end_session(h: Harness, cookie: str | None, sid: str = "sid-1"):
    hint = h.keystore.sign(
        {"iss": ISSUER, "sub": ALICE.sub, "aud": "first", "iat": h.now(), "exp": h.now() + 3600, "sid": sid},
        "RS256", "JWT",
    )
    return await h.get(
        END_SESSION,
        params={"id_token_hint": hint, "post_logout_redirect_uri": "http://127.0.0.1:9000/", "state": "s"},
        cookies={"authsrv_session": cookie} if cookie else {},
    )


async def until(rp: FakeRelyingParty, predicate, what: str) -> None:
    """Let the store's threads and the in-memory connections run until C{predicate()}."""
    for _ in range(3000):
        rp.http.flush()
        if predicate():
            return
        await deferLater(reactor, 0.001, lambda: None)
    raise AssertionError(f"never happened: {what}")


async def settle(rp: FakeRelyingParty) -> None:
    """Give anything still running a moment to do what it should not."""
    for _ in range(50):
        rp.http.flush()
        await deferLater(reactor, 0.002, lambda: None)


@pytest_twisted.ensureDeferred
async def test_every_client_of_the_session_with_a_uri_gets_a_signed_logout_token(tmp_path, monkeypatch, audit):
    rp = FakeRelyingParty()
    h = await _harness(tmp_path, monkeypatch, rp)
    try:
        await start_grant(h.store, "g-first", ALICE.sub, "first", sid="sid-1")
        await start_grant(h.store, "g-partner", ALICE.sub, "partner", sid="sid-1")
        await start_grant(h.store, "g-spa", ALICE.sub, "spa", sid="sid-1")
        await start_grant(h.store, "g-other-session", ALICE.sub, "partner", sid="sid-2")
        await h.store.revoke_grant("g-partner", h.now())
        cookie = await _logged_in(h)

        response, _ = await _end_session(h, cookie)
        assert response.code == 302

        await until(rp, lambda: len(outcomes(audit)) == 2, "both deliveries")
        await settle(rp)
        assert sorted(r["url"] for r in rp.received) == ["127.0.0.1:9000/backchannel", "127.0.0.1:9001/backchannel"]
        assert outcomes(audit) == {
            "first": "delivered (HTTP 200) at attempt 1",
            "partner": "delivered (HTTP 200) at attempt 1",
        }

        _, jwks_body = await h.get(ISSUER + "/jwks")
        jwks = JWKSet.from_json(jwks_body)
        jtis = set()
        for request in rp.received:
            assert request["content_type"] == b"application/x-www-form-urlencoded"
            [token] = request["form"]["logout_token"]
            aud = "first" if request["url"].startswith("127.0.0.1:9000") else "partner"
            # Claims given to check: jwcrypto then leaves exp alone, which holds the Clock's time.
            verified = JWT(
                jwt=token, key=jwks, expected_type="JWS", algs=["RS256"],
                check_claims={"iss": ISSUER, "aud": aud, "sub": ALICE.sub, "sid": "sid-1"},
            )
            header = verified.token.jose_header
            assert (header["typ"], header["alg"]) == ("logout+jwt", "RS256")
            claims = json.loads(verified.claims)
            assert set(claims) == {"iss", "aud", "iat", "exp", "jti", "sub", "sid", "events"}
            assert claims["events"] == {LOGOUT_EVENT: {}}
            assert (claims["iat"], claims["exp"]) == (h.now(), h.now() + 120)
            assert isinstance(claims["jti"], str) and len(claims["jti"]) >= 16
            jtis.add(claims["jti"])
        assert len(jtis) == 2
        assert not any(token in repr(audit) for token in rp.tokens())
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_the_redirect_does_not_wait_for_delivery(tmp_path, monkeypatch, audit):
    rp = FakeRelyingParty([HANG])
    h = await _harness(tmp_path, monkeypatch, rp)
    try:
        await start_grant(h.store, "g-first", ALICE.sub, "first", sid="sid-1")
        cookie = await _logged_in(h)

        response, _ = await _end_session(h, cookie)
        assert response.code == 302
        await until(rp, lambda: rp.held, "the delivery reaching the relying party")
        assert outcomes(audit) == {}

        [held] = rp.held
        held.setResponseCode(200)
        held.finish()
        await until(rp, lambda: outcomes(audit), "the delivery ending")
        assert outcomes(audit) == {"first": "delivered (HTTP 200) at attempt 1"}
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_failing_relying_party_costs_the_user_nothing(tmp_path, monkeypatch, audit):
    rp = FakeRelyingParty([500, 500, 500])
    h = await _harness(tmp_path, monkeypatch, rp)
    try:
        await start_grant(h.store, "g-first", ALICE.sub, "first", sid="sid-1")
        response, _ = await _end_session(h, await _logged_in(h))
        assert response.code == 302
        for attempts, wait in ((1, 1), (2, 5), (3, None)):
            await until(rp, lambda: len(rp.received) == attempts, f"attempt {attempts}")
            if wait:
                await until(rp, lambda: h.clock.getDelayedCalls(), "the retry being scheduled")
                h.clock.advance(wait)
        await until(rp, lambda: outcomes(audit), "giving up")
        h.clock.advance(3600)
        await settle(rp)
        assert len(rp.received) == 3
        assert outcomes(audit) == {"first": "gave up after 3 attempts, last: HTTP 500"}
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_nothing_is_sent_without_a_session_or_a_uri(tmp_path, monkeypatch, audit):
    rp = FakeRelyingParty()
    h = await _harness(tmp_path, monkeypatch, rp)
    try:
        await start_grant(h.store, "g-first", ALICE.sub, "first", sid="sid-1")
        await start_grant(h.store, "g-spa", ALICE.sub, "spa", sid="sid-spa")

        response, _ = await _end_session(h, None)
        assert response.code == 302
        response, _ = await _end_session(h, await _logged_in(h, sid="sid-spa"), sid="sid-spa")
        assert response.code == 302
        await until(rp, lambda: audit.of("session.ended"), "the session ending")
        for _ in range(3):
            await settle(rp)
            h.clock.advance(60)
        await settle(rp)
        assert rp.received == []
        assert outcomes(audit) == {}
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_new_login_of_another_user_ends_the_earlier_session_and_tells_its_clients(
        tmp_path, monkeypatch, audit):
    """Another user signing in on the browser replaces its session: its clients hear of the old one's end."""
    rp = FakeRelyingParty()
    h = await _harness(tmp_path, monkeypatch, rp)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        old = await h.store.get_session(browser.session_hash, h.now())
        await browser.sign_in(BOB, prompt="login")
        assert browser.session_hash != old.session_hash
        assert (await h.store.get_session(browser.session_hash, h.now())).sid != old.sid
        await until(rp, lambda: len(outcomes(audit)) == 1, "the delivery for the ended session")
        [request] = rp.received
        [token] = request["form"]["logout_token"]
        claims = json.loads(JWT(jwt=token, key=JWKSet.from_json(h.keystore.jwks_bytes()), expected_type="JWS",
                                algs=["RS256"], check_claims={"sid": old.sid}).claims)
        assert (claims["aud"], claims["sub"]) == ("first", ALICE.sub)
    finally:
        await h.close()


@pytest.mark.parametrize("page", ["authorize", "account"])
@pytest_twisted.ensureDeferred
async def test_a_session_found_disabled_at_its_next_use_tells_its_clients(tmp_path, monkeypatch, audit, page):
    """
    A user disabled in the identity backend counts as banned (docs/design.md,
    Bans), but the server learns of it only when it next looks: the browser
    session then ends, and its clients hear of that by back-channel logout
    as they would of a ban.
    """
    rp = FakeRelyingParty()
    h = await _harness(tmp_path, monkeypatch, rp)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        session = await h.store.get_session(browser.session_hash, h.now())
        await h.identity.set_disabled(ALICE.login, True, "left")

        response, _ = await (browser.authorize() if page == "authorize" else browser.get(ISSUER + "/account"))
        assert response.code in (200, 302, 303)
        assert await h.store.get_session(session.session_hash, h.now()) is None
        await until(rp, lambda: len(outcomes(audit)) == 1, "the delivery for the session found disabled")
        [token] = rp.tokens()
        claims = json.loads(JWT(jwt=token, key=JWKSet.from_json(h.keystore.jwks_bytes()), expected_type="JWS",
                                algs=["RS256"], check_claims={"sid": session.sid}).claims)
        assert (claims["aud"], claims["sub"]) == ("first", ALICE.sub)
        assert [e["reason"] for e in audit.of("session.ended")] == ["user banned, disabled or removed"]
    finally:
        await h.close()


@pytest.mark.parametrize("asking", [{"prompt": "login"}, {"max_age": "0"}])
@pytest_twisted.ensureDeferred
async def test_signing_in_again_as_the_same_user_logs_no_client_out(tmp_path, monkeypatch, audit, asking):
    """
    A client asking for a fresh sign-in (prompt=login, max_age) re-authenticates
    the user: the session carries on under its sid with a new cookie, and the
    other clients of the session are not logged out; they hear of its real end.
    """
    rp = FakeRelyingParty()
    h = await _harness(tmp_path, monkeypatch, rp)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE, "first")
        old = await h.store.get_session(browser.session_hash, h.now())
        h.clock.advance(100)
        query = await browser.sign_in(ALICE, "partner", **asking)
        assert "code" in query
        again = await h.store.get_session(browser.session_hash, h.now())
        assert browser.session_hash != old.session_hash
        assert await h.store.get_session(old.session_hash, h.now()) is None
        assert (again.sid, again.sub, again.auth_time) == (old.sid, ALICE.sub, h.now())
        await settle(rp)
        assert rp.received == [] and outcomes(audit) == {}
        assert audit.of("session.ended") == []

        response, _ = await _end_session(h, browser.cookies["authsrv_session"], sid=old.sid)
        assert response.code == 302
        await until(rp, lambda: len(outcomes(audit)) == 2, "both deliveries at the real end")
        assert sorted(r["url"] for r in rp.received) == ["127.0.0.1:9000/backchannel", "127.0.0.1:9001/backchannel"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_operator_ban_logs_the_user_out_at_the_relying_parties(tmp_path, audit):
    """docs/design.md, Bans: the ban ends the user's sessions and their clients hear of it by back-channel."""
    rp = FakeRelyingParty()
    port = reactor.listenTCP(0, Site(rp), interface="127.0.0.1")
    config, _ = prepare_data_dir(tmp_path / "data")
    try:
        added = await admin("--config", str(config), "user", "add", "alice", "--password-stdin", cwd=tmp_path,
                            stdin="a long password\n")
        sub = added.stdout.split("(sub ")[1].split(")")[0]
        store = sqlite.open_store(reactor, tmp_path / "data" / "authsrv.sqlite3")
        try:
            await store.put_client(Client(
                "rp", None, ["http://127.0.0.1:9/cb"],
                backchannel_logout_uri=f"http://127.0.0.1:{port.getHost().port}/backchannel",
            ))
            await start_grant(store, "g-rp", sub, "rp", sid="sid-9")
            await store.create_session(BrowserSession(token_hash("cookie"), "sid-9", sub, 1, 1, 2_000_000_000))
        finally:
            await store.close()
        banned = await admin("--config", str(config), "ban", "alice", "--reason", "spam", cwd=tmp_path)
        assert banned.returncode == 0, banned.stderr
        assert "1 browser sessions ended" in banned.stdout
    finally:
        await port.stopListening()
    [request] = rp.received
    [token] = request["form"]["logout_token"]
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "==="))
    assert (claims["sub"], claims["sid"], claims["aud"]) == (sub, "sid-9", "rp")
    events = [json.loads(line)["event"] for line in banned.stderr.splitlines()]
    assert events == ["user.banned", "session.ended", "logout.backchannel"]


@pytest_twisted.ensureDeferred
async def test_logout_tokens_use_the_client_id_token_algorithm(tmp_path, monkeypatch, audit):
    """Signed as the client's ID tokens; none for a client whose algorithm is no longer offered."""
    rp = FakeRelyingParty()
    monkeypatch.setattr(backchannel, "default_http_client", lambda reactor: lambda address: rp.http)
    clients = [{**c, "id_token_signed_response_alg": "ES256"} if c["client_id"] == "first" else c for c in _clients()]
    config = {"clients": clients, "keystore": {"algorithms": ["RS256", "ES256", "EdDSA"]}}
    h = await Harness(tmp_path, monkeypatch, config).start()
    errors: list[dict] = []
    globalLogPublisher.addObserver(errors.append)
    try:
        partner = await h.store.get_client("partner")
        await h.store.put_client(attrs.evolve(partner, id_token_signed_response_alg="PS256"))
        await start_grant(h.store, "g-first", ALICE.sub, "first", sid="sid-1")
        await start_grant(h.store, "g-partner", ALICE.sub, "partner", sid="sid-1")
        response, _ = await _end_session(h, await _logged_in(h))
        assert response.code == 302

        await until(rp, lambda: len(outcomes(audit)) == 1, "the first client's delivery")
        await settle(rp)
        assert outcomes(audit) == {"first": "delivered (HTTP 200) at attempt 1"}
        [token] = rp.tokens()
        _, jwks_body = await h.get(ISSUER + "/jwks")
        verified = JWT(jwt=token, key=JWKSet.from_json(jwks_body), expected_type="JWS", algs=["ES256"],
                       check_claims={"iss": ISSUER, "aud": "first"})
        assert verified.token.jose_header["alg"] == "ES256"
        assert any(e.get("client_id") == "partner" and e.get("alg") == "PS256" for e in errors)
    finally:
        globalLogPublisher.removeObserver(errors.append)
        await h.close()
