"""
The audit log as an operator reads it: every security event docs/design.md
lists, driven through the flows (direct calls where a flow is awkward), each
one JSON line with the documented fields and nothing secret in any of them;
the operator command's lines in the same file; reopening on SIGUSR1 or SIGHUP.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from urllib.parse import urlencode

import pytest
import pytest_twisted
from attrs import evolve
from twisted.internet import reactor
from twisted.internet.defer import succeed
from twisted.internet.task import deferLater
from twisted.logger import formatEvent, globalLogPublisher

from authsrv import events
from authsrv.auditlog import REPLAY_WINDOW, AuditObserver, is_audit
from authsrv.embedded import prepare_data_dir
from authsrv.flows import moderation
from authsrv.identity.chain import IdentityChain
from authsrv.identity.passwords import hash_password
from authsrv.logfile import LineFile, reopen_on_signals
from authsrv.operations.clients import ClientOperations
from authsrv.operations.users import UserOperations
from authsrv.service import sync_config_clients
from authsrv.testing.identity import ALICE, BOB, MALLORY, PASSWORDS

from conftest import admin
from device_helpers import TV, approve, poll, start
from flow_client import Browser, location, login_url
from harness import CHEAP, CLIENTS, INTERNAL_SECRET, SECRETS, Harness, pkce_pair, query_of
from token_helpers import REVOKE, exchange, post_form, refresh, save_code, tokens, verify_jwt

ROOT = Path(__file__).parent.parent
PEER = "127.0.0.1"
"""The address every request of the harness comes from."""
TOKEN_ENDPOINT_EVENTS = ("token.issued", "code.reused", "refresh.reused", "device.code_reused", "token.revoked")
"""The token and revocation endpoints' events, which name the caller's address."""
ISSUER_DEVICE = "/api/auth/device"
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def audit_lines(path: Path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


class AuditFile:
    """The audit log in C{path} while the test runs, as the server writes it."""

    def __init__(self, path: Path):
        self.path = path
        self.observer = AuditObserver(LineFile(str(path)))

    def __enter__(self):
        globalLogPublisher.addObserver(self.observer)
        return self

    def __exit__(self, *exc):
        globalLogPublisher.removeObserver(self.observer)
        self.observer.file.close()


async def _front_channel(h: Harness, secrets: list[str]) -> None:
    """Log-ins of every outcome, consent both ways, a code, tokens, a refresh, reuse and revocation."""
    browser = Browser(h)
    _, page = await browser.authorize("partner", scope="openid email", state="state-value-9",
                                      login_hint="hint-value-9")
    page_url = login_url(page)
    response, _ = await browser.submit_login(page_url, ALICE.login, "not-alices-password-9")
    response, _ = await browser.submit_login(page_url, "nobody-at-all", PASSWORDS[ALICE.sub])
    response, _ = await browser.submit_login(page_url, MALLORY.login, PASSWORDS[MALLORY.sub])
    response, _ = await browser.submit_login(page_url, ALICE.login, PASSWORDS[ALICE.sub])
    assert response.code == 303 and "/consent?" in location(response)
    response, _ = await browser.answer_consent(location(response), "approve")
    secrets += [query_of(location(response))["code"], "not-alices-password-9", *browser.cookies.values()]

    denier = Browser(h)
    response, _ = await denier.authorize("partner", scope="openid")
    response, _ = await denier.submit_login(response, BOB.login, PASSWORDS[BOB.sub])
    await denier.answer_consent(location(response), "deny")
    secrets += denier.cookies.values()

    issued = await tokens(h)
    rotated = (await refresh(h, issued["refresh_token"]))[1]
    public = await tokens(h, client_id="spa", scope="openid offline_access")
    await refresh(h, public["refresh_token"], client_id="spa")
    await refresh(h, public["refresh_token"], client_id="spa")
    await post_form(h, "/api/auth/oauth2/revoke", {"token": rotated["refresh_token"]})
    await _pushed(h, secrets)
    code, verifier = await save_code(h)
    replayed = (await exchange(h, code, verifier))[1]
    await exchange(h, code, verifier)
    secrets += [code, verifier, *(t for answer in (issued, rotated, public, replayed) for t in answer.values()
                                  if isinstance(t, str) and len(t) > 20)]


async def _pushed(h: Harness, secrets: list[str]) -> None:
    """A pushed authorization request, used, then brought back again."""
    verifier, challenge = pkce_pair()
    _, pushed = await post_form(h, "/api/auth/oauth2/par", {
        "response_type": "code", "redirect_uri": "http://127.0.0.1:9000/callback", "scope": "openid",
        "state": "state-value-8", "code_challenge": challenge, "code_challenge_method": "S256",
    })
    by_reference = "/api/auth/oauth2/authorize?" + urlencode({"client_id": "first", "request_uri": pushed["request_uri"]})
    await Browser(h).get(by_reference)
    await Browser(h).get(by_reference)
    secrets += [pushed["request_uri"], verifier]


async def _device(h: Harness, secrets: list[str]) -> None:
    """A device approved, redeemed and replayed; another denied; a wrong user code."""
    codes = await start(h, scope="openid profile")
    await poll(h, codes["device_code"])
    browser = Browser(h)
    await approve(h, browser, codes)
    issued = (await poll(h, codes["device_code"]))[1]
    await poll(h, codes["device_code"])
    denied = await start(h, scope="openid")
    await approve(h, browser, denied, action="deny")
    await browser.get(ISSUER_DEVICE + "?user_code=BBBB-BBBB")
    secrets += [codes["device_code"], codes["user_code"], codes["user_code"].replace("-", ""),
                denied["device_code"], issued["access_token"], issued["id_token"], *browser.cookies.values()]


async def _throttled(h: Harness) -> None:
    """Failed log-ins until the throttle refuses one."""
    browser = Browser(h)
    page_url = login_url((await browser.authorize("first", scope="openid"))[1])
    for _ in range(h.config.throttle.failures_per_pair + 1):
        await browser.submit_login(page_url, BOB.login, "not-bobs-password-9")
        h.clock.advance(0.1)


async def _operator(h: Harness) -> None:
    """Ban (ending a session), unban, revoke every grant, config clients changing, a key rotation."""
    browser = Browser(h)
    await browser.sign_in(ALICE, "first", scope="openid")

    def notify(session):
        return succeed(None)

    await moderation.ban_user(h.store, ALICE.sub, reason="spam", until=None, now=h.now(), actor="operator",
                              notify=notify)
    await moderation.unban_user(h.store, ALICE.sub, actor="operator")
    await moderation.revoke_user(h.store, ALICE.sub, now=h.now(), actor="operator", notify=notify)
    declared = [c for c in h.config.clients if c.client_id != "gateway"]
    declared[0] = evolve(declared[0], name="Renamed")
    declared.append(evolve(declared[1], client_id="newcomer"))
    await sync_config_clients(h.store, declared)
    await h.keystore.rotate(h.now())
    await _admin_api(h, notify)


async def _admin_api(h: Harness, notify) -> None:
    """What the admin API and the operator command do to users and clients, through their operations."""
    users = UserOperations(store=h.store, identity=IdentityChain([h.identity], ("static",)), notify=notify,
                           clock=h.clock, hash_password=lambda password: succeed(hash_password(password, CHEAP)))
    await users.create({"login": "carol", "password": "a rather long passphrase 7"}, actor="admin-api")
    await users.set_password("carol", "another long passphrase 8", actor="admin-api")
    await users.set_disabled("carol", True, reason="left", actor="admin-api")
    await users.set_disabled("carol", False, actor="admin-api")
    await users.end_sessions(ALICE.sub, actor="admin-api")
    await users.revoke_consents(ALICE.sub, actor="admin-api")
    await users.delete("carol", actor="admin-api")
    clients = ClientOperations(store=h.store, clock=h.clock, declared=frozenset(), resolve=None)
    created, _ = await clients.create({"client_id": "by-api", "redirect_uris": ["https://app.example/cb"]},
                                      actor="admin-api")
    await clients.rotate_secret(created.client_id, actor="admin-api")


def _awkward() -> None:
    """
    Events whose flows need a relying party, a chat platform, an overloaded
    server, a process start or an authenticator app (the MFA flows have
    their own tests in tests/flows/test_mfa.py, the passkey and account ones
    in tests/flows/test_account_page.py and tests/web/test_passkeys_browser.py).
    """
    events.login_hint_mismatch(sub=ALICE.sub, hinted_sub=BOB.sub, client_id="first", address="192.0.2.1")
    events.throttle_engaged(login="alice", address="192.0.2.1", reason="too many password checks in flight")
    events.backchannel_logout(client_id="first", session_id="sid-1", outcome="200 at attempt 1")
    events.grant_revoked(sub=ALICE.sub, client_id="first", grant_id="g-1", reason="user not allowed",
                         address="192.0.2.1")
    events.rate_limited(endpoint="token", client_id="first", address="192.0.2.1", retry_after=1)
    events.config_loaded(path="/etc/authsrv/authsrv.toml", issuer="https://id.example.com/api/auth", clients=3)
    events.chat_linked(sub=ALICE.sub, provider="chat", account_id="a-1", provider_user_id="u-1", address="192.0.2.1")
    events.chat_link_refused(sub=ALICE.sub, provider="chat", provider_user_id="u-1", address="192.0.2.1")
    events.chat_stale_link_replaced(sub=ALICE.sub, provider="chat", account_id="a-0", provider_user_id="u-1",
                                    former_sub=BOB.sub, address="192.0.2.1")
    events.chat_unlinked(sub=ALICE.sub, provider="chat", address="192.0.2.1")
    events.chat_refreshed(sub=ALICE.sub, provider="chat", account_id="a-1", rotated=True)
    events.chat_refresh_failed(sub=ALICE.sub, provider="chat", account_id="a-1", reason="revoked")
    events.mfa_enrolled(sub=ALICE.sub, kind="totp", address="192.0.2.1")
    events.mfa_succeeded(sub=ALICE.sub, method="otp", address="192.0.2.1")
    events.mfa_failed(sub=ALICE.sub, address="192.0.2.1", reason="wrong code")
    events.mfa_enrolment_put_off(sub=ALICE.sub, grace_until=1_800_000_000, address="192.0.2.1")
    events.recovery_codes_replaced(sub=ALICE.sub, address="192.0.2.1")
    events.factors_reset(sub=ALICE.sub, actor="operator")
    events.passkey_registered(sub=ALICE.sub, credential="c-1", synced=True, address="192.0.2.1")
    events.passkey_succeeded(sub=ALICE.sub, credential="c-1", address="192.0.2.1")
    events.passkey_refused(sub=ALICE.sub, credential="c-1", address="192.0.2.1", reason="counter went back")
    events.passkey_removed(sub=ALICE.sub, credential="c-1", address="192.0.2.1")
    events.account_session_ended(sub=ALICE.sub, session_id="sid-2", address="192.0.2.1")
    events.account_app_revoked(sub=ALICE.sub, client_id="first", grants=1, address="192.0.2.1")
    events.password_changed(sub=ALICE.sub, sessions_ended=1, address="192.0.2.1")
    events.password_change_refused(sub=ALICE.sub, reason="wrong current password", address="192.0.2.1")
    events.registration_refused(address="192.0.2.1", reason="the initial access token is not valid")
    events.assertion_replayed(client_id="first", address="192.0.2.1")


@pytest_twisted.ensureDeferred
async def test_every_event_is_one_documented_line_without_secrets(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, {"throttle": {"failures_per_pair": 2}, "par": {"enabled": True},
                                              "clients": [*CLIENTS, TV]}).start()
    secrets = [*PASSWORDS.values(), *SECRETS.values(), INTERNAL_SECRET]
    try:
        with AuditFile(tmp_path / "audit.log") as audit:
            await _front_channel(h, secrets)
            await _device(h, secrets)
            await _throttled(h)
            await _operator(h)
            _awkward()
        lines = audit_lines(audit.path)
    finally:
        await h.close()

    assert {line["event"] for line in lines} == set(events.EVENT_FIELDS)
    assert {line["grant_type"] for line in lines if line["event"] == "token.issued"} >= {
        "authorization_code", "refresh_token", "urn:ietf:params:oauth:grant-type:device_code"}
    assert {line["reason"] for line in lines if line["event"] == "login.failed"} >= {"wrong password", "unknown user"}
    assert {line["actor"] for line in lines if line["event"].startswith("user.")} == {"operator", "admin-api"}
    assert {(line["event"], line["client_id"]) for line in lines if line["event"].startswith("client.")} == {
        ("client.changed", "first"), ("client.created", "newcomer"), ("client.deleted", "gateway"),
        ("client.created", "by-api"), ("client.secret_rotated", "by-api")}
    ended = [line for line in lines if line["event"] == "session.ended"]
    assert ended and all(line["session_id"] and line["sub"] == ALICE.sub for line in ended)
    issued_in_browsers = [line for line in lines if line["event"] == "code.issued"]
    assert issued_in_browsers and all(line["session_id"] and line["address"] == PEER for line in issued_in_browsers)
    for name in TOKEN_ENDPOINT_EVENTS:
        called = [line for line in lines if line["event"] == name]
        assert called and all(line["address"] == PEER for line in called), name
    for line in lines:
        assert list(line)[:len(events.COMMON_FIELDS)] == list(events.COMMON_FIELDS), line
        assert set(line) == {*events.COMMON_FIELDS, *events.EVENT_FIELDS[line["event"]]}, line
        assert ISO_MS.match(line["time"]) and line["outcome"], line

    text = audit.path.read_text()
    assert len(secrets) > 20
    for secret in secrets:
        assert secret not in text, secret


async def _signed_in_tokens(h: Harness, headers: dict, browser: Browser | None = None) -> tuple[str, dict]:
    """A browser sign-in's code exchanged with C{headers}: (the code, the token response and the verifier)."""
    verifier, challenge = pkce_pair()
    code = (await (browser or Browser(h)).sign_in(ALICE, "spa", scope="openid offline_access",
                                                  challenge=challenge))["code"]
    response, body = await exchange(h, code, verifier, client_id="spa", headers=headers)
    assert response.code == 200, body
    return code, {**body, "verifier": verifier}


@pytest_twisted.ensureDeferred
async def test_token_endpoint_events_name_the_forwarded_address_and_the_code_its_session(tmp_path, monkeypatch, audit):
    """
    Behind a trusted proxy each event names the address of the request
    that caused it: a refresh token replayed from elsewhere names where the
    replay came from, not where the token was issued to.
    """
    h = await Harness(tmp_path, monkeypatch, {"server": {"trusted_proxies": [f"{PEER}/32"]},
                                              "clients": [*CLIENTS, TV]}).start()
    owner, thief = {"X-Forwarded-For": "198.51.100.7"}, {"X-Forwarded-For": "203.0.113.66"}
    browser = Browser(h)
    try:
        code, issued = await _signed_in_tokens(h, owner, browser)
        assert (await exchange(h, code, issued["verifier"], client_id="spa", headers=thief))[0].code == 400
        _, rotated = await _signed_in_tokens(h, owner)
        assert (await refresh(h, rotated["refresh_token"], client_id="spa", headers=owner))[0].code == 200
        response, body = await refresh(h, rotated["refresh_token"], client_id="spa", headers=thief)
        assert response.code == 400 and body["error"] == "invalid_grant"
        revoked = await tokens(h)
        await post_form(h, REVOKE, {"token": revoked["refresh_token"]}, headers=owner)
        codes = await start(h, scope="openid")
        await approve(h, Browser(h), codes)
        for sender in (owner, thief):
            await post_form(h, "/api/auth/oauth2/token", {
                "grant_type": "urn:ietf:params:oauth:grant-type:device_code", "device_code": codes["device_code"],
                "client_id": "tv"}, None, headers=sender)
    finally:
        await h.close()

    sid = verify_jwt(h, issued["id_token"], aud="spa")[1]["sid"]
    assert [(e["sub"], e["session_id"]) for e in audit.of("code.issued")][0] == (ALICE.sub, sid)
    assert sid not in (browser.cookies["authsrv_session"], browser.session_hash)
    assert [(e["grant_type"], e["address"]) for e in audit.of("token.issued")] == [
        ("authorization_code", "198.51.100.7"), ("authorization_code", "198.51.100.7"),
        ("refresh_token", "198.51.100.7"), ("authorization_code", PEER),
        ("urn:ietf:params:oauth:grant-type:device_code", "198.51.100.7")]
    assert [(e["client_id"], e["address"]) for e in audit.of("code.reused")] == [("spa", "203.0.113.66")]
    assert [(e["client_id"], e["address"], e["reason"]) for e in audit.of("refresh.reused")] == [
        ("spa", "203.0.113.66", "refresh token reused")]
    assert [(e["kind"], e["address"]) for e in audit.of("token.revoked")] == [("refresh", "198.51.100.7")]
    assert [(e["client_id"], e["address"]) for e in audit.of("device.code_reused")] == [("tv", "203.0.113.66")]


@pytest_twisted.ensureDeferred
async def test_a_forwarded_address_from_an_untrusted_peer_is_not_believed(tmp_path, monkeypatch, audit):
    """A caller not among the trusted proxies cannot put another address into the audit log with a header."""
    h = await Harness(tmp_path, monkeypatch, {"server": {"trusted_proxies": ["10.0.0.0/8"]}}).start()
    forged = {"X-Forwarded-For": "192.0.2.99", "Forwarded": "for=192.0.2.98"}
    try:
        _, rotated = await _signed_in_tokens(h, forged)
        assert (await refresh(h, rotated["refresh_token"], client_id="spa", headers=forged))[0].code == 200
        assert (await refresh(h, rotated["refresh_token"], client_id="spa", headers=forged))[0].code == 400
        await post_form(h, REVOKE, {"token": (await tokens(h))["access_token"]}, headers=forged)
    finally:
        await h.close()

    assert [e["address"] for e in audit.of("token.issued")] == [PEER] * 3
    assert [e["address"] for e in audit.of("refresh.reused")] == [PEER]
    assert [(e["kind"], e["address"]) for e in audit.of("token.revoked")] == [("access", PEER)]


def test_the_documented_table_is_the_schema():
    """docs/audit.md lists the common fields and each event with exactly its own fields."""
    doc = (ROOT / "docs" / "audit.md").read_text()
    common = re.findall(r"^\| `(\w+)` \| common \|", doc, re.M)
    assert tuple(common) == events.COMMON_FIELDS
    rows = dict(re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \| ([^|]*) \|", doc, re.M))
    assert set(rows) == set(events.EVENT_FIELDS)
    for name, own in events.EVENT_FIELDS.items():
        assert re.findall(r"`(\w+)`", rows[name]) == list(own), name


@pytest.mark.parametrize("number", [signal.SIGUSR1, signal.SIGHUP])
@pytest_twisted.ensureDeferred
async def test_lines_are_flushed_and_the_file_reopens_on_sigusr1_or_sighup(tmp_path, number):
    path = tmp_path / "audit.log"
    previous = {n: signal.getsignal(n) for n in (signal.SIGUSR1, signal.SIGHUP)}
    try:
        with AuditFile(path) as audit:
            reopen_on_signals(reactor, [audit.observer.file])
            events.user_unbanned(sub="s-1", actor="operator")
            assert [line["event"] for line in audit_lines(path)] == ["user.unbanned"]
            path.rename(tmp_path / "audit.log.1")
            os.kill(os.getpid(), number)
            await deferLater(reactor, 0.05, lambda: None)
            events.user_unbanned(sub="s-2", actor="operator")
        assert [line["sub"] for line in audit_lines(tmp_path / "audit.log.1")] == ["s-1"]
        assert [line["sub"] for line in audit_lines(path)] == ["s-2"]
    finally:
        for n, handler in previous.items():
            signal.signal(n, handler)


@pytest_twisted.ensureDeferred
async def test_the_operator_command_writes_to_the_configured_audit_file(tmp_path):
    config, _ = prepare_data_dir(tmp_path / "data")
    with config.open("a") as file:
        file.write('\n[audit]\npath = "audit.log"\n')
    added = await admin("--config", str(config), "client", "add", "shop", "--redirect-uri",
                        "https://shop.example/cb", cwd=tmp_path)
    secret = added.stdout.split("client_secret:")[1].strip()
    removed = await admin("--config", str(config), "client", "remove", "shop", cwd=tmp_path)
    assert added.returncode == removed.returncode == 0
    assert "{" not in added.stderr + removed.stderr
    lines = audit_lines(tmp_path / "data" / "audit.log")
    assert [(line["event"], line["client_id"], line["actor"]) for line in lines] == [
        ("client.created", "shop", "operator"), ("client.deleted", "shop", "operator")]
    assert secret not in (tmp_path / "data" / "audit.log").read_text()


def test_an_event_replayed_by_the_log_beginner_is_written_once(tmp_path):
    """twist replays the events logged before it began to every observer: the audit file keeps one line each."""
    observer = AuditObserver(LineFile(str(tmp_path / "audit.log")))
    event = {"log_namespace": "authsrv.audit", "event": "config.loaded", "log_format": "loaded",
             "log_time": 1_800_000_000.0, "outcome": "success", "path": "p", "issuer": "i", "clients": 0}
    observer(event)
    observer(event)
    observer(dict(event))
    observer.file.close()
    assert [line["event"] for line in audit_lines(tmp_path / "audit.log")] == ["config.loaded", "config.loaded"]


def test_the_replay_window_is_bounded(tmp_path):
    """Only the last REPLAY_WINDOW events are remembered: an older one seen again is written again."""
    observer = AuditObserver(LineFile(str(tmp_path / "audit.log")))
    made = [{"log_namespace": "authsrv.audit", "event": "config.loaded", "log_time": 1_800_000_000.0 + i,
             "outcome": "success", "path": str(i), "issuer": "i", "clients": 0} for i in range(REPLAY_WINDOW + 1)]
    for event in made:
        observer(event)
    observer(made[1])
    observer(made[0])
    observer.file.close()
    paths = [line["path"] for line in audit_lines(tmp_path / "audit.log")]
    assert paths == [str(i) for i in range(REPLAY_WINDOW + 1)] + ["0"]


def test_events_a_full_disk_refuses_are_dropped_with_one_line_each_way(tmp_path, monkeypatch):
    """
    An audit line the file refuses (a full disk, here /dev/full) is lost,
    said once when that starts and once, with how many, when writing works
    again, never with a traceback per event.
    """
    logged: list[dict] = []
    globalLogPublisher.addObserver(logged.append)
    path = tmp_path / "audit.log"
    path.symlink_to("/dev/full")
    observer = AuditObserver(LineFile(str(path)))
    globalLogPublisher.addObserver(observer)
    try:
        for n in range(3):
            events.config_loaded(path=str(n), issuer="i", clients=0)
        path.unlink()
        observer.file.reopen()
        events.config_loaded(path="3", issuer="i", clients=0)
    finally:
        globalLogPublisher.removeObserver(observer)
        globalLogPublisher.removeObserver(logged.append)
    observer.file.close()
    assert [line["path"] for line in audit_lines(path)] == ["3"]
    problems = [formatEvent(e) for e in logged if not is_audit(e)]
    assert problems == [
        f"cannot write to {path}: No space left on device; its lines are dropped until it can",
        f"writing to {path} again; 3 lines were dropped",
    ]
