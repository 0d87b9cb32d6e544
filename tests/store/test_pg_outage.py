"""
When the store is down: 503 with a clear error, never a 500 and never a
hang past the configured timeouts; readiness false; recovery by itself when
the database is back; and no grant that was acknowledged is lost, even when
PostgreSQL restarts under load.

The real-process tests stop and start a PostgreSQL cluster of their own
(C{stoppable_postgres}), so that other tests on the session's cluster are
unaffected, and so that a server named by AUTHSRV_TEST_POSTGRES_DSN, which
the tests did not start, is never stopped.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg2
import pytest
import pytest_twisted
import requests
from twisted.internet.defer import fail, gatherResults
from twisted.internet.task import Clock, deferLater
from twisted.logger import formatEvent, globalLogPublisher
from zope.interface import Interface

from authsrv.config import parse_config
from authsrv.configsection import Section
from authsrv.context import PluginContext
from authsrv.identity.chain import IdentityChain
from authsrv.interfaces import IStore
from authsrv.keys import jwkfile
from authsrv.records import Ban
from authsrv.service import STARTUP_RETRY, AuthsrvService
from authsrv.store import postgres as postgres_store
from authsrv.store.errors import StoreUnavailable
from conftest import fetch, free_port
from harness import INTERNAL_SECRET, SECRETS, Harness
from prepared_keys import write_key_file
from pg_servers import (
    ALICE,
    TIMEOUT,
    Browser,
    NotRedirected,
    exchange,
    introspect,
    pg_config,
    refresh,
    user_access,
    userinfo,
)

STATEMENT_TIMEOUT = CONNECT_TIMEOUT = 1
ANSWER_WITHIN = STATEMENT_TIMEOUT + CONNECT_TIMEOUT + 1 + 1.5
"""The longest a request may take while the store fails: both timeouts, the client's margin, slack."""


# --- in memory: every route maps the store's failure --------------------------


def _store_methods() -> set[str]:
    names = set()
    for interface in IStore.__iro__:
        if interface is not Interface:
            names |= set(interface.names())
    return names - {"close"}


@pytest_twisted.ensureDeferred
async def test_every_route_answers_503_while_the_store_fails(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    for name in _store_methods():
        monkeypatch.setattr(h.store, name, lambda *args, **kwargs: fail(StoreUnavailable("connection refused")))
    try:
        first = {"client_id": "first", "client_secret": SECRETS["first"]}
        json_calls = [
            ("POST", "/api/auth/oauth2/token", {"data": {**first, "grant_type": "refresh_token",
                                                         "refresh_token": "r"}}),
            ("GET", "/api/auth/oauth2/userinfo", {"headers": {"Authorization": "Bearer a"}}),
            ("POST", "/api/auth/oauth2/introspect", {"data": {**first, "token": "a"}}),
            ("POST", "/api/auth/oauth2/revoke", {"data": {**first, "token": "a"}}),
        ]
        for method, path, options in json_calls:
            response, body = await h.request(method, path, **options)
            assert response.code == 503, (path, body)
            assert json.loads(body)["error"] == "temporarily_unavailable", path
            assert response.headers.getRawHeaders(b"retry-after") == [b"5"]
            assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]

        pages = [
            "/api/auth/oauth2/authorize?client_id=first&response_type=code&scope=openid"
            "&redirect_uri=http%3A%2F%2F127.0.0.1%3A9000%2Fcallback&code_challenge="
            + "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM&code_challenge_method=S256",
            "/api/auth/login?request=r",
            "/api/auth/consent?request=r",
        ]
        for path in pages:
            response, body = await h.request("GET", path)
            assert response.code == 503, (path, body)
            assert response.headers.getRawHeaders(b"content-type") == [b"text/html; charset=utf-8"]
            assert b"Try again later" in body
            assert response.headers.getRawHeaders(b"x-frame-options") == [b"DENY"]

        response, body = await h.request(
            "POST", "/api/internal/user-access", data=json.dumps({"userId": "u"}).encode(),
            headers={"Authorization": f"Bearer {INTERNAL_SECRET}", "Content-Type": "application/json"},
        )
        assert (response.code, json.loads(body)["error"]) == (503, "temporarily_unavailable")
        assert response.headers.getRawHeaders(b"retry-after") == [b"5"]

        response, body = await h.request("GET", "/readyz")
        assert (response.code, json.loads(body)["status"]) == (503, "unavailable")
        response, _ = await h.request("GET", "/api/auth/.well-known/openid-configuration")
        assert response.code == 200
    finally:
        monkeypatch.undo()
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_store_down_at_start_is_retried_until_the_server_is_ready(pg_dsn, tmp_path):
    """
    The database may be gone between the start-up check and storing the
    config's clients: one line each time, as for any outage, no traceback.
    """
    from twisted.internet import reactor

    clock = Clock()
    config = parse_config({"clients": [{"client_id": "spa", "redirect_uris": ["http://127.0.0.1:9002/cb"]}]},
                          tmp_path / "authsrv.toml")
    context = PluginContext(reactor, tmp_path)
    store = postgres_store.from_config(Section({"dsn": pg_dsn}, "store", tmp_path), context)
    write_key_file(tmp_path / "keys.jwks.json")
    keystore = jwkfile.from_config(Section({}, "keystore", tmp_path), context)
    refusals = [StoreUnavailable("PostgreSQL: Connection refused")] * 2
    put_client = store.put_client
    store.put_client = lambda client: fail(refusals.pop()) if refusals else put_client(client)
    server = AuthsrvService(reactor=clock, config=config, context=context, store=store, keystore=keystore,
                            identity=IdentityChain([]), ports=[])
    logged: list[dict] = []
    globalLogPublisher.addObserver(logged.append)
    server.startService()
    try:
        for left in (1, 0):
            while len(refusals) > left:
                await deferLater(reactor, 0.01, lambda: None)
            assert server.readiness_problem() == "starting"
            clock.advance(STARTUP_RETRY)
        for _ in range(500):
            if server.readiness_problem() is None:
                break
            clock.advance(STARTUP_RETRY)
            await deferLater(reactor, 0.01, lambda: None)
        assert server.readiness_problem() is None and refusals == []
        assert (await store.get_client("spa")).redirect_uris == ("http://127.0.0.1:9002/cb",)
    finally:
        globalLogPublisher.removeObserver(logged.append)
        await server.stopService()
    retries = [e for e in logged if "trying again" in e.get("log_format", "")]
    assert [formatEvent(e) for e in retries] == [
        f"could not store the clients declared in the config file (PostgreSQL: Connection refused);"
        f" trying again in {STARTUP_RETRY}s"
    ] * 2
    assert not any("log_failure" in e for e in retries), "an outage is no traceback"


# --- real processes on a cluster of their own ---------------------------------


def test_a_server_the_tests_did_not_start_is_never_stopped(postgres, stoppable_postgres, monkeypatch):
    """
    With AUTHSRV_TEST_POSTGRES_DSN naming a server, the tests only connect to
    it: stopping it is refused, and the cluster outage tests stop is another.
    """
    from pgcluster import DSN_VARIABLE, Cluster

    monkeypatch.setenv(DSN_VARIABLE, postgres.admin_dsn)
    outside = Cluster()
    for change in (outside.stop, outside.start):
        with pytest.raises(RuntimeError, match="the tests did not start it"):
            change()
    outside.destroy()
    assert stoppable_postgres.admin_dsn != postgres.admin_dsn
    connection = psycopg2.connect(postgres.admin_dsn)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
    finally:
        connection.close()


@pytest.mark.parametrize("mode", ["immediate", "fast"])
@pytest_twisted.ensureDeferred
async def test_after_a_restart_the_first_calls_on_the_old_connections_succeed(stoppable_postgres, tmp_path, mode):
    """
    Every pooled connection of a server that restarted (after a crash, or
    C{pg_ctl restart}, which ends each session with a goodbye) is dead,
    and the reactor learns so only when it next reads them: a read and a
    write answered at once still succeed, each on a new connection.
    """
    from twisted.internet import reactor

    context = PluginContext(reactor, tmp_path)
    store = postgres_store.from_config(
        Section({"dsn": stoppable_postgres.database(), "pool_size": 3}, "store", tmp_path), context)
    try:
        await store.ban_user(Ban(ALICE, "spam", 0))
        await gatherResults([store.get_ban(ALICE, 0) for _ in range(3)])
        stoppable_postgres.stop(mode)
        stoppable_postgres.start()
        ban, _ = await gatherResults([store.get_ban(ALICE, 0), store.ban_user(Ban("bob", "spam", 0))])
        assert ban.reason == "spam"
        assert (await store.get_ban("bob", 0)).reason == "spam"
    finally:
        await store.close()
        context.stop()


@pytest.fixture
def server(stoppable_postgres, run_server, tmp_path):
    port = free_port()
    config = pg_config(tmp_path, stoppable_postgres.database(), port, port, timeout=STATEMENT_TIMEOUT)
    # A log file, not a pipe nobody reads during the test: under load the pipe would fill and block the server.
    return run_server(
        ["--log-file", str(tmp_path / "authsrv.log"), "authsrv", "--config", str(config)], tmp_path, port=port
    )


def timed(call, *args):
    start = time.monotonic()
    answer = call(*args)
    return answer, time.monotonic() - start


def wait_ready(base: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if fetch(base + "/readyz", timeout=5)[0] == 200:
            return
        time.sleep(0.02)
    raise AssertionError("the server did not become ready again")


@pytest.mark.slow
def test_outage_answers_503_then_the_server_recovers(stoppable_postgres, server):
    browser = Browser()
    code, verifier = browser.authorize(server.base)
    acknowledged = exchange(server.base, code, verifier).json()

    stoppable_postgres.stop()
    try:
        for call, args in (
            (refresh, (server.base, acknowledged["refresh_token"])),
            (introspect, (server.base, acknowledged["access_token"])),
            (userinfo, (server.base, acknowledged["access_token"])),
        ):
            answer, took = timed(call, *args)
            assert (answer.status_code, answer.json()["error"]) == (503, "temporarily_unavailable"), call
            assert took < ANSWER_WITHIN
        answer, took = timed(user_access, server.base, ALICE)
        assert (answer.status_code, answer.json()["error"]) == (503, "temporarily_unavailable")
        with pytest.raises(NotRedirected) as page:
            browser.authorize(server.base)
        assert page.value.status == 503 and "Try again later" in page.value.body
        assert fetch(server.base + "/readyz")[0] == 503
        assert fetch(server.base + "/api/auth/jwks")[0] == 200
    finally:
        stoppable_postgres.start()

    wait_ready(server.base)
    assert introspect(server.base, acknowledged["access_token"]).json()["active"] is True
    refreshed = refresh(server.base, acknowledged["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    assert userinfo(server.base, refreshed.json()["access_token"]).json()["sub"] == ALICE
    # The browser session outlived the outage too: a new code without a login.
    code, verifier = browser.authorize(server.base)
    assert exchange(server.base, code, verifier).status_code == 200


class Chain:
    """One grant's refresh chain; one request at a time, as one client would."""

    def __init__(self, tokens: dict):
        self.lock = threading.Lock()
        self.refresh_token = tokens["refresh_token"]
        self.access_tokens = [tokens["access_token"]]


@pytest.mark.slow
def test_restart_under_load_loses_no_acknowledged_grant(stoppable_postgres, server):
    """
    200 requests paced over four seconds from eight threads (new grants,
    refreshes, introspections) while PostgreSQL stops after one second and
    starts again a second later: every answer is a success or a 503 in
    time, and every success is still valid afterwards.
    """
    browser = Browser()
    chains = []
    for _ in range(8):
        code, verifier = browser.authorize(server.base)
        chains.append(Chain(exchange(server.base, code, verifier).json()))
    chains_lock = threading.Lock()
    statuses: list[tuple[float, int]] = []
    start = time.monotonic()

    def new_grant():
        try:
            code, verifier = browser.authorize(server.base)
        except NotRedirected as e:
            return e.status
        answer = exchange(server.base, code, verifier)
        if answer.status_code == 200:
            with chains_lock:
                chains.append(Chain(answer.json()))
        return answer.status_code

    def rotate(chain):
        with chain.lock:
            answer = refresh(server.base, chain.refresh_token)
            if answer.status_code == 200:
                tokens = answer.json()
                chain.refresh_token = tokens["refresh_token"]
                chain.access_tokens.append(tokens["access_token"])
        return answer.status_code

    def check(chain):
        answer = introspect(server.base, chain.access_tokens[-1])
        assert answer.status_code != 200 or answer.json()["active"] is True
        return answer.status_code

    def request(n):
        time.sleep(max(0.0, start + n * 0.02 - time.monotonic()))
        with chains_lock:
            chain = chains[n % len(chains)]
        sent = time.monotonic()
        status = (new_grant, lambda: rotate(chain), lambda: rotate(chain), lambda: check(chain))[n % 4]()
        took = time.monotonic() - sent
        assert status in (200, 503), status
        assert took < 2 * ANSWER_WITHIN, took
        statuses.append((sent - start, status))

    def restart():
        time.sleep(1.0)
        stoppable_postgres.stop()
        time.sleep(1.0)
        stoppable_postgres.start()

    restarter = threading.Thread(target=restart)
    restarter.start()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(request, range(200)))
    restarter.join()

    outcomes = [status for _, status in statuses]
    assert 503 in outcomes, "the restart did not happen under load"
    assert 200 in [status for sent, status in statuses if sent > 3.5], "no success after the restart"

    wait_ready(server.base)
    for chain in chains:
        for access_token in chain.access_tokens:
            assert introspect(server.base, access_token).json()["active"] is True
        # The last acknowledged refresh token still works: if a rotation
        # committed but its answer was lost, this is its replay.
        assert refresh(server.base, chain.refresh_token).status_code == 200
    assert len(chains) > 8
    assert requests.get(server.base + "/readyz", timeout=TIMEOUT).status_code == 200


def _end_backends(dsn: str) -> int:
    """pg_terminate_backend on every other session of the database of C{dsn}, as an operator would; how many."""
    with psycopg2.connect(dsn) as admin, admin.cursor() as cursor:
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                       " WHERE datname = current_database() AND pid <> pg_backend_pid()")
        (ended,) = cursor.fetchone()
    admin.close()
    return ended


def _unavailable(answer: requests.Response) -> bool:
    """The contract's 503: temporarily_unavailable, Retry-After, not stored."""
    return (answer.status_code, answer.json()["error"], answer.headers.get("retry-after"),
            answer.headers.get("cache-control")) == (503, "temporarily_unavailable", "5", "no-store")


@pytest.fixture
def server_on_dsn(stoppable_postgres, run_server, tmp_path):
    """
    A server on a database of its own, and that database's DSN; without
    rate limits, which the tests' bursts of reads would otherwise meet.
    """
    dsn = stoppable_postgres.database()
    port = free_port()
    config = pg_config(tmp_path, dsn, port, port, timeout=STATEMENT_TIMEOUT)
    config.write_text(config.read_text() + '\n[rate_limits]\ndefault = "off"\ninternal = "off"\n')
    server = run_server(
        ["--log-file", str(tmp_path / "authsrv.log"), "authsrv", "--config", str(config)], tmp_path, port=port
    )
    return server, dsn


@pytest.mark.slow
def test_after_pg_terminate_backend_reads_answer_and_a_refresh_answers_or_says_503(server_on_dsn, tmp_path):
    """
    The server's sessions ended by an operator (pg_terminate_backend) while
    idle, their goodbyes still on the way: UserInfo, introspection and
    user-access, which only read, answer as usual; a refresh, a write,
    answers or says 503 in the contract's shape, never an error of its own.
    """
    server, dsn = server_on_dsn
    code, verifier = Browser().authorize(server.base)
    tokens = exchange(server.base, code, verifier).json()
    reads = (
        (lambda: userinfo(server.base, tokens["access_token"]), "sub", ALICE),
        (lambda: introspect(server.base, tokens["access_token"]), "active", True),
        (lambda: user_access(server.base, ALICE), "allowed", True),
    )
    with ThreadPoolExecutor(8) as pool:
        for _ in range(5):
            for read, field, value in reads:
                # Every pooled connection in use once, then ended.
                list(pool.map(lambda _: introspect(server.base, tokens["access_token"]), range(16)))
                assert _end_backends(dsn) >= 1
                answer = read()
                assert (answer.status_code, answer.json().get(field)) == (200, value), answer.text
            _end_backends(dsn)
            rotated = refresh(server.base, tokens["refresh_token"])
            assert rotated.status_code == 200 or _unavailable(rotated), rotated.text
            if rotated.status_code == 200:
                tokens = rotated.json()
    log = (tmp_path / "authsrv.log").read_text()
    assert "Traceback" not in log and "Unhandled" not in log
    assert tokens["access_token"][:12] not in log and tokens["refresh_token"][:12] not in log


@pytest.mark.slow
def test_a_burst_through_a_stop_and_start_all_answered_then_everything_recovers(stoppable_postgres, server_on_dsn,
                                                                               tmp_path):
    """
    50 requests at once while PostgreSQL stops under them: each is answered
    in time (an answer or the contract's 503, never a hang), /readyz says
    unavailable until the database is back, then every hot path and a
    sign-in work again without restarting authsrv; nothing in the log is a
    traceback or shows a token.
    """
    server, _ = server_on_dsn
    browser = Browser()
    code, verifier = browser.authorize(server.base)
    tokens = exchange(server.base, code, verifier).json()
    access, refresh_token = tokens["access_token"], tokens["refresh_token"]
    calls = ((userinfo, access), (introspect, access), (user_access, ALICE), (refresh, "unknown-refresh-token"))
    stopper = threading.Thread(target=stoppable_postgres.stop)

    def request(n):
        if n == 10:
            stopper.start()
        call, argument = calls[n % len(calls)]
        return timed(call, server.base, argument)

    try:
        with ThreadPoolExecutor(16) as pool:
            answered = list(pool.map(request, range(50)))
        stopper.join()
        for (answer, took), n in zip(answered, range(50)):
            expected = 400 if calls[n % len(calls)][0] is refresh else 200
            assert answer.status_code == expected or _unavailable(answer), (n, answer.text)
            assert took < ANSWER_WITHIN
        assert fetch(server.base + "/readyz")[0] == 503
        assert _unavailable(introspect(server.base, access))
    finally:
        if not stoppable_postgres.running:
            stoppable_postgres.start()

    wait_ready(server.base)
    assert userinfo(server.base, access).json()["sub"] == ALICE
    assert introspect(server.base, access).json()["active"] is True
    assert user_access(server.base, ALICE).json()["allowed"] is True
    assert refresh(server.base, refresh_token).status_code == 200
    code, verifier = Browser().authorize(server.base)
    assert exchange(server.base, code, verifier).status_code == 200
    log = (tmp_path / "authsrv.log").read_text()
    assert "Traceback" not in log and "Unhandled" not in log
    assert access[:12] not in log and refresh_token[:12] not in log
