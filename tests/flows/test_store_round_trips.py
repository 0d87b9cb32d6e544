"""
How many store calls and durable commits each hot request makes through the
real HTTP app, on SQLite and on PostgreSQL, once the client cache is warm: a
code exchange finds the code (with its grant and the user's ban: a read) and
redeems it in the transaction that writes the tokens; a refresh looks the
token up (with its grant and the ban) and rotates it; introspection and
UserInfo make one lookup each and commit nothing; the authorization
request that answers with the login form commits only the request it keeps,
and the form sends the writes that do not wait on each other together. The
exchange's and the refresh's commits wait for the disk (on PostgreSQL, for
the log's flush); none of the form's does. A change that adds a round trip
or a commit to these paths fails here before it shows in the benchmark.
A configured chat platform changes nothing: the lookups bring the user's
linked account for the chat_user_id claim along.
"""

from __future__ import annotations

from collections import Counter

import psycopg2
import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from authsrv.chat.crypto import ACCESS, new_key_text
from authsrv.pg import pool
from authsrv.records import LinkedAccount
from authsrv.store import postgres, sqlite
from authsrv.store.codes import CodeRedeemed
from authsrv.testing.identity import ALICE, PASSWORDS
from flow_client import Browser, hidden_fields, location
from device_helpers import TV, approve, error_of, poll, start
from harness import CLIENTS, ISSUER, Harness
from token_helpers import (
    USERINFO, SignedAfterSending, exchange, introspect, refresh, save_code, tokens,
    verify_jwt,
)


class SQLiteCommits:
    """
    The COMMITs run on the store's writer connection (the reader's are
    read-only), and those of them that waited for the disk: the connection
    opens at the default C{synchronous = FULL}, and a change of level is a
    statement of its own.
    """

    def __init__(self, monkeypatch):
        self._count = self._durable = 0
        self._level = "FULL"
        opened = sqlite._open

        def traced(*args):
            connection = opened(*args)
            connection.set_trace_callback(self._traced)
            return connection

        monkeypatch.setattr(sqlite, "_open", traced)

    def _traced(self, statement: str) -> None:
        if statement.startswith("PRAGMA synchronous = "):
            self._level = statement.rpartition(" ")[2]
        if statement == "COMMIT":
            self._count += 1
            self._durable += self._level == "FULL"

    def since_last(self) -> int:
        count, self._count = self._count, 0
        return count

    def durable_since_last(self) -> int:
        count, self._durable = self._durable, 0
        return count


class PostgresCommits:
    """
    The transactions that wrote to the database since the last count, told
    by the rows they left: a row version's xmin is the ID of the transaction
    that wrote it, and a transaction gets an ID only when it writes. Counted
    on the store's tables alone, so other databases of the cluster (their
    autovacuum) change nothing.
    """

    def __init__(self, dsn: str):
        self._db = psycopg2.connect(dsn)
        self._db.autocommit = True
        self._since = self._next_id()

    def _rows(self, sql: str, params=None) -> list[tuple]:
        with self._db.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    def _next_id(self) -> int:
        return self._rows("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint % 4294967296")[0][0]

    def since_last(self) -> int:
        tables = [name for name, in self._rows("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        written = " UNION ".join(f"SELECT xmin::text::bigint AS id FROM {table}" for table in tables)
        count = self._rows(f"SELECT count(*) FROM ({written}) AS w WHERE id >= %(since)s", {"since": self._since})
        self._since = self._next_id()
        return count[0][0]

    def close(self) -> None:
        self._db.close()


@pytest.fixture(params=[False, True], ids=["no-chat", "chat"])
def chat(request, monkeypatch) -> dict:
    """The configuration of no chat platform, or of one."""
    if not request.param:
        return {}
    monkeypatch.setenv("AUTHSRV_TEST_CHAT_KEY", new_key_text())
    return {"chat": {"encryption_key_env": "AUTHSRV_TEST_CHAT_KEY"}}


@pytest.fixture(params=["sqlite", "sqlite-one-core", "postgres"])
def h(request, tmp_path, monkeypatch, chat):
    """
    A harness on either store, with the device client L{TV} besides the
    usual ones and C{commits} counting its durable commits; on one core
    SQLite's writes too are handed to its thread once per reactor turn.
    """
    if request.param == "sqlite-one-core":
        monkeypatch.setattr(sqlite.os, "sched_getaffinity", lambda pid: {0})
    config = {**chat, "clients": [*CLIENTS, TV]}
    if request.param.startswith("sqlite"):
        commits = SQLiteCommits(monkeypatch)
        harness = Harness(tmp_path, monkeypatch, config)
    else:
        dsn = request.getfixturevalue("pg_dsn")
        harness = Harness(tmp_path, monkeypatch, config, postgres_dsn=dsn)
        commits = PostgresCommits(dsn)
        harness.steps = PostgresSteps(monkeypatch)
    harness.commits = commits
    harness.one_core = request.param == "sqlite-one-core"
    yield harness
    pytest_twisted.blockon(Deferred.fromCoroutine(harness.close()))
    if isinstance(commits, PostgresCommits):
        commits.close()


class PostgresSteps:
    """The queries sent to PostgreSQL as a flow's steps (L{postgres.STEP}), which commit without waiting."""

    def __init__(self, monkeypatch):
        self._count = 0
        execute = pool._Cursor.execute

        def counting(cursor, query, params=None):
            self._count += postgres.STEP in query
            return execute(cursor, query, params)

        monkeypatch.setattr(pool._Cursor, "execute", counting)

    def since_last(self) -> int:
        count, self._count = self._count, 0
        return count


def durable_commits(h):
    """
    A count of SQLite's commits that waited for the disk, from now on; None
    on PostgreSQL, where L{PostgresSteps} counts, from now on, what does not
    wait.
    """
    if not isinstance(h.commits, SQLiteCommits):
        h.steps.since_last()
        return None
    h.commits.durable_since_last()
    return h.commits.durable_since_last


class Batches:
    """The sizes of the batches of reads a SQLite store's reader thread is handed, one per round trip."""

    def __init__(self, worker):
        self.sizes: list[int] = []
        self._queue = worker._queue
        worker._queue = self

    def put(self, batch) -> None:
        self.sizes.append(len(batch))
        self._queue.put(batch)

    def __getattr__(self, name):
        return getattr(self._queue, name)


def counted(monkeypatch, store) -> Counter:
    """Every public call on C{store}, by name, from now on."""
    calls: Counter = Counter()
    for name in dir(store):
        method = getattr(store, name)
        if name.startswith("_") or not callable(method):
            continue

        def counting(*args, _name=name, _method=method, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)

        monkeypatch.setattr(store, name, counting)
    return calls


@pytest_twisted.ensureDeferred
async def test_the_hot_paths_make_one_round_trip_per_step_and_one_commit_per_grant_change(h, monkeypatch):
    await h.start()
    warm = await tokens(h)
    assert (await refresh(h, warm["refresh_token"]))[0].code == 200
    await introspect(h, warm["access_token"])  # the introspecting client, cached too
    await h.store.link_account(LinkedAccount(
        account_id="acct-alice", sub=ALICE.sub, provider="discord", provider_user_id="555000111",
        access_token_enc=h.chat_cipher.encrypt("x", "acct-alice", ACCESS), refresh_token_enc=None,
        scope="identify", expires_at=h.now() + 60, updated_at=h.now(),
    ))
    chat_user_id = "555000111" if h.config.chat else ALICE.chat_user_id
    code, verifier = await save_code(h)

    calls = counted(monkeypatch, h.store)
    h.commits.since_last()
    durable = durable_commits(h)
    response, body = await exchange(h, code, verifier)
    assert response.code == 200, body
    assert (calls, h.commits.since_last()) == (Counter(find_code=1, redeem_code=1), 1)
    assert durable is None or durable() == 1, "the tokens wait for the disk"
    if durable is None:
        assert h.steps.since_last() == 0, "the tokens wait for the flush"
    assert verify_jwt(h, body["id_token"])[1]["chat_user_id"] == chat_user_id

    calls.clear()
    response, rotated = await refresh(h, body["refresh_token"])
    assert response.code == 200, rotated
    assert (calls, h.commits.since_last()) == (Counter(get_refresh_token=1, rotate_refresh=1), 1)
    assert durable is None or durable() == 1, "the rotation waits for the disk"
    if durable is None:
        assert h.steps.since_last() == 0, "the rotation waits for the flush"
    assert verify_jwt(h, rotated["id_token"])[1]["chat_user_id"] == chat_user_id

    calls.clear()
    assert (await introspect(h, rotated["access_token"]))["active"] is True
    assert (calls, h.commits.since_last()) == (Counter(find_access_token=1), 0)

    calls.clear()
    response, claims = await h.json("GET", USERINFO, headers={"Authorization": f"Bearer {rotated['access_token']}"})
    assert response.code == 200
    assert (calls, h.commits.since_last()) == (Counter(find_access_token=1), 0)
    assert claims["chat_user_id"] == chat_user_id


@pytest_twisted.ensureDeferred
async def test_a_password_sign_in_sends_the_writes_that_do_not_wait_on_each_other_together(h, monkeypatch):
    """
    The authorization request that answers with the login form writes only
    the request it keeps (the form's passkey challenge carries its own
    proof). The form's POST counts the attempt before the password is checked
    (reading whether the browser is a known device of the account in the same
    step), then reads the user's ban and second factors in one round trip, then
    writes the check's outcome (the throttle's and the known device's)
    with the interaction used up, then the new session with the code: where
    the store hands a reactor turn's writes over together (SQLite on one
    core), three commits.
    """
    await h.start()
    await Browser(h).authorize("first")  # the challenges' key made, once per store
    browser = Browser(h)
    h.commits.since_last()
    response, body = await browser.authorize("first")
    assert response.code == 200 and b'data-passkey="get"' in body, body
    assert h.commits.since_last() == 1, "the login form writes the request it keeps, its passkey challenge nothing"
    fields = {**hidden_fields(body), "username": ALICE.login, "password": PASSWORDS[ALICE.sub]}

    calls = counted(monkeypatch, h.store)
    reads = Batches(h.store._reader) if isinstance(h.store, sqlite.SQLiteStore) else None
    h.commits.since_last()
    durable = durable_commits(h)
    response, body = await browser.post(ISSUER + "/login", fields)
    assert response.code == 303 and "code=" in location(response), body
    writes = ("attempt", "succeeded", "remember_device", "take_interaction", "create_session", "save_code")
    assert {name: calls[name] for name in writes} == dict.fromkeys(writes, 1)
    after_the_check = ("get_ban", "get_totp", "list_passkeys")
    assert {name: calls[name] for name in after_the_check} == dict.fromkeys(after_the_check, 1)
    if reads is not None:
        assert reads.sizes == [1, 3], "the interaction, then the ban and both factors (the device is the attempt's)"
    if h.one_core:
        assert h.commits.since_last() == 3
    assert durable is None or durable() == 0, "a sign-in's steps do not wait for the disk; its tokens will"
    if durable is None:
        assert h.steps.since_last() == len(writes), "each write of the sign-in a step that does not wait"


@pytest_twisted.ensureDeferred
async def test_the_id_token_is_signed_while_the_store_writes_the_tokens(h, monkeypatch):
    """
    A code exchange sends its redemption to the store, then signs the ID
    token while the store commits it; so does a refresh, whose replay (a
    confidential client's grace window) keeps the ID token's claims and
    signs them again when replayed: to the very same token under RS256.
    """
    await h.start()
    code, verifier = await save_code(h)
    public_code, public_verifier = await save_code(h, client_id="spa")
    sent = SignedAfterSending(monkeypatch, h.store, h.keystore, ("redeem_code", "rotate_refresh"))

    response, body = await exchange(h, code, verifier)
    assert response.code == 200, body
    assert sent.since_last() == ["redeem_code", "sign"]
    verify_jwt(h, body["id_token"])

    response, rotated = await refresh(h, body["refresh_token"])
    assert response.code == 200, rotated
    assert sent.since_last() == ["rotate_refresh", "sign"]
    verify_jwt(h, rotated["id_token"])
    response, replayed = await refresh(h, body["refresh_token"])
    assert (response.code, replayed) == (200, rotated)
    assert sent.since_last() == ["rotate_refresh", "sign", "sign"], "the replay's ID token signed again"

    response, public = await exchange(h, public_code, public_verifier, client_id="spa")
    assert response.code == 200, public
    response, public_rotated = await refresh(h, public["refresh_token"], client_id="spa")
    assert response.code == 200, public_rotated
    assert sent.since_last() == ["redeem_code", "sign", "rotate_refresh", "sign"]
    verify_jwt(h, public_rotated["id_token"], aud="spa")


@pytest_twisted.ensureDeferred
async def test_a_signature_that_fails_after_the_redemption_was_sent_spends_the_code(h, monkeypatch):
    """
    The redemption is on its way when the signature fails: the client gets
    a server error, the redemption still commits, and the code, spent, is
    refused afterwards as reuse, as a code whose answer was lost would be.
    """
    await h.start()
    code, verifier = await save_code(h)
    redeem, sign = h.store.redeem_code, h.keystore.sign
    writes = []

    def broken(*args, **kwargs):
        raise ValueError("no active RS256 signing key")

    monkeypatch.setattr(h.store, "redeem_code", lambda *args: writes.append(redeem(*args)) or writes[-1])
    monkeypatch.setattr(h.keystore, "sign", broken)
    response, body = await exchange(h, code, verifier)
    assert (response.code, body["error"]) == (500, "server_error"), body
    assert isinstance(await writes[0], CodeRedeemed)
    monkeypatch.setattr(h.keystore, "sign", sign)
    response, body = await exchange(h, code, verifier)
    assert (response.code, body["error"]) == (400, "invalid_grant"), body
    assert "already used" in body["error_description"]


@pytest_twisted.ensureDeferred
async def test_a_pending_device_poll_is_one_step_that_does_not_wait_and_the_tokens_do(h, monkeypatch):
    """
    A device polls every few seconds for minutes: a poll the person has not
    answered yet writes only its time (for slow_down), a step of the flow
    that no crash needs to keep, in one call; the approved device's tokens
    wait for the disk, as a code exchange's do.
    """
    await h.start()
    codes = await start(h)  # the client cached

    calls = counted(monkeypatch, h.store)
    h.commits.since_last()
    durable = durable_commits(h)
    assert error_of(await poll(h, codes["device_code"])) == "authorization_pending"
    assert (calls, h.commits.since_last()) == (Counter(poll_device_authorization=1), 1)
    assert durable is None or durable() == 0, "a pending poll does not wait for the disk"
    if durable is None:
        assert h.steps.since_last() == 1, "a pending poll is a step that does not wait for the flush"

    await approve(h, Browser(h), codes)
    h.clock.advance(5)
    h.commits.since_last()
    durable = durable_commits(h)
    response, body = await poll(h, codes["device_code"])
    assert response.code == 200, body
    assert durable is None or durable() == 1, "the tokens wait for the disk"
    if durable is None:
        assert h.steps.since_last() == 1, "the poll is a step; the redemption with the tokens waits for the flush"
