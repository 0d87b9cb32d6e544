"""
Two real C{twist authsrv} processes on one PostgreSQL database serve one
user's flow interchangeably, as two instances behind a load balancer would:
nothing a step needs lives in the memory of the instance that did the step
before.

Both have the same issuer (instance A's address) and the same signing keys
(one jwk-file keystore file); the test talks to each directly.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
import pytest_twisted
import requests

from conftest import admin, free_port
from dpop_proofs import ec_key, proof
from pg_servers import (
    ALICE,
    CLIENT,
    REDIRECT_URI,
    TIMEOUT,
    Browser,
    exchange,
    introspect,
    pg_config,
    pkce_pair,
    refresh,
    user_access,
    userinfo,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def instances(run_server, pg_dsn, tmp_path):
    """Instances A and B, and A's config file (the operator command uses it)."""
    port_a, port_b = free_port(), free_port()
    config_a = pg_config(tmp_path, pg_dsn, port_a, port_a)
    config_b = pg_config(tmp_path, pg_dsn, port_b, port_a)
    # A first: it creates the key file that B then reads.
    # Logs go to files: nobody reads the servers' pipes during the test.
    a = run_server(["--log-file", str(tmp_path / "a.log"), "authsrv", "--config", str(config_a)], tmp_path, port=port_a)
    b = run_server(["--log-file", str(tmp_path / "b.log"), "authsrv", "--config", str(config_b)], tmp_path, port=port_b)
    assert a.get_json("/api/auth/jwks") == b.get_json("/api/auth/jwks")
    return a, b, config_a


@pytest_twisted.ensureDeferred
async def test_one_flow_across_two_instances(instances, tmp_path):
    a, b, config_a = instances
    browser = Browser()

    code, verifier = browser.authorize(a.base)
    issued = exchange(b.base, code, verifier)
    assert issued.status_code == 200, issued.text
    refreshed = refresh(a.base, issued.json()["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    tokens = refreshed.json()
    active = introspect(b.base, tokens["access_token"]).json()
    assert active["active"] is True and active["sub"] == ALICE and active["client_id"] == "demo-app"
    assert userinfo(b.base, tokens["access_token"]).json()["sub"] == ALICE
    assert user_access(b.base, ALICE).json() == {
        "allowed": True, "banned": False, "banReason": None, "hasActiveGrant": True,
    }

    # The code replayed at A ends the grant it started, seen at B at once.
    assert exchange(a.base, code, verifier).json()["error"] == "invalid_grant"
    assert introspect(b.base, tokens["access_token"]).json() == {"active": False}

    # A's browser session gives a new code without a new login.
    code, verifier = browser.authorize(a.base)
    live = exchange(b.base, code, verifier).json()
    banned = await admin("--config", str(config_a), "ban", "alice", "--reason", "chargeback", cwd=tmp_path)
    assert banned.returncode == 0, banned.stderr
    assert introspect(b.base, live["access_token"]).json() == {"active": False}
    assert user_access(b.base, ALICE).json() == {
        "allowed": False, "banned": True, "banReason": "chargeback", "hasActiveGrant": True,
    }
    assert refresh(b.base, live["refresh_token"]).json()["error"] == "invalid_grant"
    assert userinfo(a.base, live["access_token"]).status_code == 401


def test_refresh_presented_to_both_at_once_keeps_one_chain(instances):
    a, b, _ = instances
    browser = Browser()
    for _ in range(10):
        code, verifier = browser.authorize(a.base)
        current = exchange(b.base, code, verifier).json()["refresh_token"]
        both = threading.Barrier(2)
        answers: dict[str, object] = {}

        def present(name, base):
            both.wait()
            answers[name] = refresh(base, current)

        threads = [threading.Thread(target=present, args=pair) for pair in (("a", a.base), ("b", b.base))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        winners = {name: answer.json() for name, answer in answers.items() if answer.status_code == 200}
        losers = [answer.json()["error"] for answer in answers.values() if answer.status_code != 200]
        assert winners, losers
        assert losers in ([], ["invalid_grant"])
        successors = {tokens["refresh_token"] for tokens in winners.values()}
        assert len(successors) == 1, "two live refresh chains"
        (successor,) = successors
        # The one successor lives on; the token both were shown is spent.
        assert refresh(a.base, successor).status_code == 200


def _at_once(calls) -> list:
    """The answers of C{calls}, each made on its own thread, all let go together."""
    start = threading.Barrier(len(calls))
    answers: list = [None] * len(calls)

    def run(index, call):
        start.wait()
        answers[index] = call()

    threads = [threading.Thread(target=run, args=pair) for pair in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_a_code_presented_four_times_at_once_issues_once_then_revokes(instances):
    """Two presentations at each instance: one answer has tokens, and the reuse ends them at once."""
    a, b, _ = instances
    browser = Browser()
    for _ in range(5):
        code, verifier = browser.authorize(a.base)
        answers = _at_once([lambda base=base: exchange(base, code, verifier) for base in (a.base, b.base) * 2])
        issued = [answer.json() for answer in answers if answer.status_code == 200]
        assert len(issued) == 1, [answer.text for answer in answers]
        assert [answer.json()["error"] for answer in answers if answer.status_code != 200] == ["invalid_grant"] * 3
        assert introspect(b.base, issued[0]["access_token"]).json() == {"active": False}
        assert refresh(a.base, issued[0]["refresh_token"]).json()["error"] == "invalid_grant"


def _login_via_proxy(base: str, client_address: str, password: str) -> int:
    """One sign-in as a trusted proxy on 127.0.0.1 forwards it for C{client_address}: the login POST's status."""
    session = requests.Session()
    forwarded = {"X-Forwarded-For": client_address}
    verifier, challenge = pkce_pair()
    page = session.get(
        base + "/api/auth/oauth2/authorize",
        params={"client_id": CLIENT[0], "redirect_uri": REDIRECT_URI, "response_type": "code",
                "scope": "openid", "state": "s", "code_challenge": challenge, "code_challenge_method": "S256"},
        headers=forwarded, allow_redirects=False, timeout=TIMEOUT,
    )
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page.text))
    answer = session.post(base + "/api/auth/login", data={**fields, "username": "alice", "password": password},
                          headers=forwarded, allow_redirects=False, timeout=TIMEOUT)
    return answer.status_code


@pytest_twisted.ensureDeferred
async def test_login_failures_count_across_instances_behind_a_trusted_proxy(run_server, pg_dsn, tmp_path):
    """
    Both instances read the client's address from the proxy's header and
    share one count in the store: an attacker gets five tries in all, not
    five per instance (the address's limit, so the wait does not depend on
    how long a password check takes), and the real user, elsewhere, still
    signs in.
    """
    port_a, port_b = free_port(), free_port()
    configs = [pg_config(tmp_path, pg_dsn, port, port_a) for port in (port_a, port_b)]
    for config in configs:
        text = config.read_text().replace("[server]\n", '[server]\ntrusted_proxies = ["127.0.0.1"]\n', 1)
        config.write_text(text + "\n[throttle]\nfailures_per_address = 5\n")
    a = run_server(["--log-file", str(tmp_path / "a.log"), "authsrv", "--config", str(configs[0])], tmp_path,
                   port=port_a)
    b = run_server(["--log-file", str(tmp_path / "b.log"), "authsrv", "--config", str(configs[1])], tmp_path,
                   port=port_b)
    attacker = "203.0.113.66"
    statuses = [_login_via_proxy(server.base, attacker, "guess") for server in (a, b, a, b, a, b)]
    assert statuses == [200, 200, 200, 200, 200, 429]
    assert _login_via_proxy(b.base, "198.51.100.5", "alice-password") == 303
    # Bursts at once, half at each instance: right passwords from the throttled address all wait, and of
    # eight wrong ones from another address five are checked and counted, so the right one then waits too.
    both = (a.base, b.base)
    throttled = _at_once([lambda base=base: _login_via_proxy(base, attacker, "alice-password") for base in both * 3])
    assert throttled == [429] * 6
    burst = _at_once([lambda base=base: _login_via_proxy(base, "203.0.113.77", "guess") for base in both * 4])
    assert sorted(burst) == [200] * 5 + [429] * 3, burst
    assert _login_via_proxy(a.base, "203.0.113.77", "alice-password") == 429


def test_a_dpop_proof_works_once_across_instances(instances):
    """
    RFC 9449 section 11.1: a proof's jti is claimed in the shared store, so
    a proof used at one instance is refused at the other, at the token
    endpoint and at UserInfo; the proofs name the shared issuer's URLs.
    """
    a, b, _ = instances
    token_url, userinfo_url = a.base + "/api/auth/oauth2/token", a.base + "/api/auth/oauth2/userinfo"
    key = ec_key()
    browser = Browser()

    def redeem(base: str, dpop: str) -> requests.Response:
        code, verifier = browser.authorize(a.base)
        return requests.post(base + "/api/auth/oauth2/token", data={
            "grant_type": "authorization_code", "code": code, "code_verifier": verifier,
            "redirect_uri": REDIRECT_URI, "client_id": CLIENT[0], "client_secret": CLIENT[1],
        }, headers={"DPoP": dpop}, timeout=TIMEOUT)

    used = proof(key, "POST", token_url, int(time.time()))
    issued = redeem(a.base, used)
    assert (issued.status_code, issued.json()["token_type"]) == (200, "DPoP"), issued.text
    replayed = redeem(b.base, used)
    assert (replayed.status_code, replayed.json()["error"]) == (400, "invalid_dpop_proof"), replayed.text
    assert "used already" in replayed.json()["error_description"]

    access_token = issued.json()["access_token"]
    once = {"Authorization": f"DPoP {access_token}",
            "DPoP": proof(key, "GET", userinfo_url, int(time.time()), access_token=access_token)}
    first = requests.get(b.base + "/api/auth/oauth2/userinfo", headers=once, timeout=TIMEOUT)
    assert first.status_code == 200 and first.json()["sub"] == ALICE, first.text
    again = requests.get(a.base + "/api/auth/oauth2/userinfo", headers=once, timeout=TIMEOUT)
    assert again.status_code == 401 and 'error="invalid_dpop_proof"' in again.headers["www-authenticate"]
