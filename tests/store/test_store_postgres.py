"""
The PostgreSQL store: both conformance suites (the concurrency one with two
separate pools on one database, as two servers would have), then what only
PostgreSQL shows: schema versions and racing migrations, the config
section, and connection failures.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time

import psycopg2
import pytest
import pytest_twisted
from twisted.internet.defer import CancelledError, Deferred, DeferredList, gatherResults
from twisted.logger import formatEvent

from authsrv import migrations
from authsrv.configsection import ConfigError, Section, Unreachable
from authsrv.context import PluginContext
from authsrv.hostlookup import HostLookups
from authsrv.pg import pool
from authsrv.pg.pool import fetch, first
from authsrv.pg.settings import targets
from authsrv.plugins import find_factory
from authsrv.store import postgres as postgres_store
from authsrv.records import DEFAULT_GRANT_TYPES, AccessState, Ban, Client, ImportBatch, NotRevoked, Rotated
from authsrv.store.codes import CodeFound, CodeNotFound, CodeRedeemed
from authsrv.store.errors import AlreadyLinked, StoreUnavailable
from authsrv.testing.store import (
    ALICE, BOB, CLIENT, KEPT_LINKS, NOW, OLDER_ROWS, SHARED_LINKS, StoreConcurrencyConformance, StoreConformance,
    check_older_rows, h, issue, kept_links, make_code, make_grant, make_linked, make_refresh, page_templates,
    start_grant,
)
from hanging_lookups import Hanging, drained, one_thread

LATEST_VERSION = postgres_store.migrations()[-1][0]


def _write_shared_links(cursor) -> None:
    """L{SHARED_LINKS}, written as an older release let two users share one provider account."""
    cursor.executemany(
        "INSERT INTO linked_accounts (account_id, sub, provider, provider_user_id, access_token_enc, scope,"
        " expires_at, updated_at, version) VALUES (%s, %s, %s, %s, '\\x00', 'identify', 0, %s, 1)",
        SHARED_LINKS,
    )


def open_store(dsn: str, **section):
    from twisted.internet import reactor

    return postgres_store.from_config(Section({"dsn": dsn, **section}, "store", "."), PluginContext(reactor, "."))


# Children before the grants they reference.
TABLES = (
    "authorization_codes", "access_tokens", "refresh_tokens", "grants", "clients", "browser_sessions",
    "interactions", "link_attempts", "consents", "bans", "linked_accounts", "link_locks", "login_attempts",
    "known_devices", "totp_factors", "recovery_codes", "mfa_demands", "device_authorizations", "client_assertions",
    "dpop_proofs",
)


@pytest.fixture(scope="class")
def class_dsn(postgres):
    """
    One migrated database per test class: creating a database costs a
    quarter of a second, emptying its tables a few milliseconds.
    """
    dsn = postgres.database()
    postgres_store.migrate(dsn, 5, 0)
    admin = psycopg2.connect(dsn)
    yield dsn, admin
    admin.close()


class PostgresDatabase:
    """An empty store database for each test, on the session's cluster."""

    @pytest.fixture(autouse=True)
    def _database(self, class_dsn):
        self.dsn, admin = class_dsn
        with admin, admin.cursor() as cursor:
            for table in TABLES:
                cursor.execute(f"DELETE FROM {table}")


class TestPostgresStore(PostgresDatabase, StoreConformance):
    def make_store(self):
        return open_store(self.dsn)


class TestPostgresConcurrency(PostgresDatabase, StoreConcurrencyConformance):
    def make_store_pair(self):
        return open_store(self.dsn), open_store(self.dsn)


def _tables(dsn: str) -> set[str]:
    with psycopg2.connect(dsn) as db, db.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {row[0] for row in cursor.fetchall()}


def _versions(dsn: str) -> list[tuple]:
    with psycopg2.connect(dsn) as db, db.cursor() as cursor:
        cursor.execute("SELECT component, version FROM schema_version ORDER BY component, version")
        return cursor.fetchall()


def _config_error(section: dict, check_only: bool = False) -> ConfigError:
    from twisted.internet import reactor

    with pytest.raises(ConfigError) as info:
        postgres_store.from_config(Section(section, "store", "."), PluginContext(reactor, ".", check_only=check_only))
    return info.value


@pytest_twisted.ensureDeferred
async def test_a_flow_step_alone_commits_without_waiting_for_the_flush(pg_dsn):
    """
    The step's prefix and its statement are one query, so one transaction:
    it runs with synchronous_commit off, and the next statement on the same
    connection waits for the flush again.
    """
    store = open_store(pg_dsn, pool_size=1)
    level = "SELECT current_setting('synchronous_commit') AS level"

    async def levels(db):
        return [(await first(db, sql))["level"] for sql in (postgres_store.STEP + level, level)]

    try:
        assert await store._pool.run(lambda db: Deferred.fromCoroutine(levels(db))) == ["off", "on"]
    finally:
        await store.close()


IMPORTED_TABLES = ("clients", "bans", "linked_accounts", "consents", "grants", "refresh_tokens")


def _analyzed(dsn: str) -> dict[str, tuple[int, float]]:
    """Each imported table's count of ANALYZE runs (not autovacuum's) and its row estimate."""
    with psycopg2.connect(dsn) as db, db.cursor() as cursor:
        cursor.execute(
            "SELECT s.relname, s.analyze_count, c.reltuples FROM pg_stat_user_tables s"
            " JOIN pg_class c ON c.oid = s.relid WHERE s.relname = ANY(%s)", (list(IMPORTED_TABLES),)
        )
        return {name: (count, rows) for name, count, rows in cursor.fetchall()}


@pytest_twisted.ensureDeferred
async def test_an_import_analyzes_the_tables_it_wrote(pg_dsn):
    """
    A running server's prepared lookups keep the plans the statistics gave
    them: planned on near-empty tables, they would read every imported row
    on each request until autovacuum came by. An import that wrote nothing
    analyzes nothing.
    """
    grants = [make_grant(f"g-imported-{n}", sub=BOB) for n in range(3)]
    batch = ImportBatch(
        clients=[Client(CLIENT, h("secret"), ["https://app.example/cb"])],
        bans=[Ban(BOB, "spam", NOW)],
        grants=grants,
        refresh_tokens=[make_refresh(f"imported-{n}", grant) for n, grant in enumerate(grants)],
    )
    store = open_store(pg_dsn)
    try:
        assert {count for count, _ in _analyzed(pg_dsn).values()} == {0}
        await store.import_batch(batch)
        after = _analyzed(pg_dsn)
        assert {name: count for name, (count, _) in after.items()} == dict.fromkeys(IMPORTED_TABLES, 1)
        assert (after["grants"][1], after["refresh_tokens"][1], after["clients"][1]) == (3, 3, 1)
        assert set((await store.import_batch(batch)).values()) == {0}
        assert _analyzed(pg_dsn) == after
    finally:
        await store.close()


class TestSchema:
    @pytest_twisted.ensureDeferred
    async def test_plugin_creates_current_schema(self, pg_dsn):
        from twisted.internet import reactor

        store = find_factory("store", "postgres").from_config(
            Section({"dsn": pg_dsn}, "store", "."), PluginContext(reactor, ".")
        )
        try:
            assert await store.ping() is None
        finally:
            await store.close()
        assert set(TABLES) | {"schema_version"} <= _tables(pg_dsn)
        assert _versions(pg_dsn) == [("store", v) for v, _, _ in postgres_store.migrations()]

    def test_instances_migrating_at_once_migrate_once(self, pg_dsn):
        starting = threading.Barrier(4)
        outcomes = []

        def start():
            starting.wait()
            try:
                outcomes.append(postgres_store.migrate(pg_dsn, 5, 1))
            except Exception as e:
                outcomes.append(e)

        threads = [threading.Thread(target=start) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert outcomes == [LATEST_VERSION] * 4
        assert _versions(pg_dsn) == [("store", v) for v, _, _ in postgres_store.migrations()]

    @pytest_twisted.ensureDeferred
    async def test_forward_migration_keeps_data(self, pg_dsn):
        store = open_store(pg_dsn)
        await store.ban_user(Ban(ALICE, "spam", NOW))
        await store.close()
        later = (LATEST_VERSION + 1, f"{LATEST_VERSION + 1:03}_ban_note.sql", "ALTER TABLE bans ADD COLUMN note TEXT;")
        assert postgres_store.migrate(pg_dsn, 5, NOW, [*postgres_store.migrations(), later]) == LATEST_VERSION + 1
        assert postgres_store.migrate(pg_dsn, 5, NOW, [*postgres_store.migrations(), later]) == LATEST_VERSION + 1
        assert _versions(pg_dsn)[-1] == ("store", LATEST_VERSION + 1)
        with psycopg2.connect(pg_dsn) as db, db.cursor() as cursor:
            cursor.execute("SELECT sub, reason, note FROM bans")
            assert cursor.fetchall() == [(ALICE, "spam", None)]

    @pytest_twisted.ensureDeferred
    async def test_upgrade_gives_existing_clients_the_default_grant_types(self, pg_dsn):
        postgres_store.migrate(pg_dsn, 5, NOW, postgres_store.migrations()[:1])
        with psycopg2.connect(pg_dsn) as db, db.cursor() as cursor:
            cursor.execute(
                "INSERT INTO clients VALUES ('old-app', NULL, '{https://old.example/cb}', '{}', '', false, false,"
                " '{}', false, NULL, 0)"
            )
        store = open_store(pg_dsn)
        try:
            assert (await store.get_client("old-app")).grant_types == DEFAULT_GRANT_TYPES
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_upgrade_keeps_one_link_of_each_provider_account(self, pg_dsn):
        """Links an older release let two users share do not stop the upgrade (docs/design.md)."""
        postgres_store.migrate(pg_dsn, 5, NOW, [step for step in postgres_store.migrations() if step[0] < 21])
        with psycopg2.connect(pg_dsn) as db, db.cursor() as cursor:
            _write_shared_links(cursor)
        store = open_store(pg_dsn)
        try:
            assert await kept_links(store) == KEPT_LINKS
            with pytest.raises(AlreadyLinked):
                await store.link_account(make_linked("acct-later", sub=ALICE))
        finally:
            await store.close()

    @pytest.mark.parametrize("older", [2, 10, 16, 18, 21, 23])
    @pytest_twisted.ensureDeferred
    async def test_rows_written_at_an_older_version_work_after_the_upgrade(self, pg_dsn, older):
        """
        From the first version, the first with passkeys, and from just
        before each step that adds an index over existing rows; each row
        with its table's columns at that version.
        """
        postgres_store.migrate(pg_dsn, 5, NOW, [step for step in postgres_store.migrations() if step[0] < older])
        written = set()
        with psycopg2.connect(pg_dsn) as db, db.cursor() as cursor:
            for table, row in OLDER_ROWS:
                cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,))
                columns = {column for column, in cursor.fetchall()}
                if columns:
                    row = {name: value for name, value in row.items() if name in columns}
                    cursor.execute(
                        f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))})",
                        list(row.values()),
                    )
                    written.add(table)
        store = open_store(pg_dsn)
        try:
            await check_older_rows(store, written)
        finally:
            await store.close()

    def test_a_step_that_fails_leaves_the_older_version_whole(self, pg_dsn):
        """
        An index of the operator's own under the name a later step creates
        stops that step: the steps before it in the same upgrade are undone
        too (a column added, duplicate links deleted), and the start stops
        with one line naming the step.
        """
        postgres_store.migrate(pg_dsn, 5, NOW, [step for step in postgres_store.migrations() if step[0] < 20])
        with psycopg2.connect(pg_dsn) as db, db.cursor() as cursor:
            _write_shared_links(cursor)
            cursor.execute("CREATE INDEX clients_source ON clients (name)")
        error = _config_error({"dsn": pg_dsn})
        assert (error.key, error.problem) == (
            "store.dsn",
            "cannot use the database: its store schema step 022_clients_source.sql failed:"
            ' relation "clients_source" already exists; the schema stays at version 19',
        )
        assert _versions(pg_dsn)[-1] == ("store", 19)
        with psycopg2.connect(pg_dsn) as db, db.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM information_schema.columns WHERE column_name = 'hinted_sub'")
            assert cursor.fetchone()[0] == 0
            cursor.execute("SELECT count(*) FROM linked_accounts")
            assert cursor.fetchone()[0] == len(SHARED_LINKS)

    def test_a_step_kept_waiting_by_an_older_instance_is_worth_trying_again(self, pg_dsn, monkeypatch):
        """An older instance's open write to the clients table holds back the step that indexes it."""
        monkeypatch.setattr(migrations, "MIGRATION_LOCK_WAIT", "1s")
        postgres_store.migrate(pg_dsn, 5, NOW, [step for step in postgres_store.migrations() if step[0] < 22])
        with contextlib.closing(psycopg2.connect(pg_dsn)) as older, older.cursor() as cursor:
            cursor.execute("LOCK TABLE clients IN ROW EXCLUSIVE MODE")
            error = _config_error({"dsn": pg_dsn})
        assert type(error) is Unreachable
        assert (error.key, error.problem) == (
            "store.dsn", "cannot use the database: canceling statement due to lock timeout")
        assert _versions(pg_dsn)[-1] == ("store", 21)

    def test_newer_schema_is_refused(self, pg_dsn):
        open_store(pg_dsn)
        with psycopg2.connect(pg_dsn) as db, db.cursor() as cursor:
            cursor.execute(
                "INSERT INTO schema_version VALUES ('store', %s, 'from the future', 0)", (LATEST_VERSION + 1,)
            )
        error = _config_error({"dsn": pg_dsn})
        assert error.key == "store.dsn"
        assert f"schema version {LATEST_VERSION + 1} is newer" in error.problem
        assert pg_dsn not in error.problem

    def test_other_components_versions_do_not_count(self, pg_dsn):
        """Other parts of authsrv may keep their versions in the same table."""
        open_store(pg_dsn)
        with psycopg2.connect(pg_dsn) as db, db.cursor() as cursor:
            cursor.execute("INSERT INTO schema_version VALUES ('keystore', 99, 'not ours', 0)")
        open_store(pg_dsn)


class TestSection:
    def test_unknown_key_is_named_and_nothing_is_created(self, pg_dsn):
        error = _config_error({"dsn": pg_dsn, "pool_sise": 4})
        assert (error.key, error.problem) == ("store.pool_sise", "unknown key")
        assert _tables(pg_dsn) == set()

    def test_check_only_validates_and_creates_nothing(self, pg_dsn):
        from twisted.internet import reactor

        context = PluginContext(reactor, ".", check_only=True)
        section = {"dsn": pg_dsn, "pool_size": 2, "statement_timeout": "3s", "connect_timeout": 2}
        assert postgres_store.from_config(Section(section, "store", "."), context) is None
        assert _tables(pg_dsn) == set()
        # Nothing is contacted: a server that is not there passes the check too.
        unreachable = {"dsn": "host=127.0.0.1 port=1 dbname=none"}
        assert postgres_store.from_config(Section(unreachable, "store", "."), context) is None
        assert _config_error({"dsn": pg_dsn, "pool_size": 0}, check_only=True).key == "store.pool_size"

    @pytest.mark.parametrize(
        "section, key, problem",
        [
            ({}, "store.dsn", "is required"),
            ({"dsn": "host=db password=hunter2"}, "store.dsn", "holds a password"),
            ({"dsn": "postgresql://authsrv:hunter2@db/authsrv"}, "store.dsn", "holds a password"),
            ({"dsn": "host=db", "dsn_env": "X"}, "store.dsn_env", "not several"),
            ({"dsn": "host=db hunter2"}, "store.dsn", "is not a PostgreSQL connection string"),
            ({"dsn": "host=db", "pool_size": 0}, "store.pool_size", "at least 1"),
            ({"dsn": "host=db", "statement_timeout": "0s"}, "store.statement_timeout", "at least 1s"),
            ({"dsn": "host=db", "connect_timeout": "soon"}, "store.connect_timeout", "duration"),
        ],
    )
    def test_bad_sections(self, section, key, problem):
        error = _config_error(section)
        assert error.key == key
        assert problem in error.problem
        assert "hunter2" not in str(error)

    @pytest_twisted.ensureDeferred
    async def test_dsn_with_password_from_file_or_environment(self, postgres, tmp_path, monkeypatch):
        """The test cluster trusts every login, so any password gets in: what counts is that it is read."""
        dsn = postgres.database() + " password=hunter2"
        (tmp_path / "dsn").write_text(dsn + "\n")
        monkeypatch.setenv("AUTHSRV_TEST_STORE_DSN", dsn)
        for section in ({"dsn_file": str(tmp_path / "dsn")}, {"dsn_env": "AUTHSRV_TEST_STORE_DSN"}):
            from twisted.internet import reactor

            store = postgres_store.from_config(Section(section, "store", tmp_path), PluginContext(reactor, tmp_path))
            try:
                assert await store.ping() is None
            finally:
                await store.close()
        malformed = tmp_path / "bad"
        malformed.write_text("host=db hunter2")
        error = _config_error({"dsn_file": str(malformed)})
        assert error.key == "store.dsn_file" and "hunter2" not in str(error)

    def test_unreachable_database_stops_start_without_showing_the_dsn(self, monkeypatch):
        monkeypatch.setenv("AUTHSRV_TEST_STORE_DSN", "host=127.0.0.1 port=1 user=authsrv password=hunter2")
        error = _config_error({"dsn_env": "AUTHSRV_TEST_STORE_DSN", "connect_timeout": 2})
        assert error.key == "store.dsn_env"
        assert "cannot use the database" in error.problem
        assert "hunter2" not in str(error)


def _elapsed_since(start: float) -> float:
    from twisted.internet import reactor

    return reactor.seconds() - start


class OwnStore(PostgresDatabase):
    """A store made by each test, with a pool of one connection and short deadlines unless it asks otherwise."""

    @pytest.fixture(autouse=True)
    def _context(self):
        from twisted.internet import reactor

        self.context = PluginContext(reactor, ".")
        yield
        self.context.stop()

    def store(self, **options):
        from twisted.internet import reactor

        settings = {
            "pool_size": 1, "statement_timeout": 1, "connect_timeout": 1,
            "lookups": pool.host_lookups(self.context, 1), **options,
        }
        return postgres_store.PostgresStore(reactor, settings.pop("dsn", self.dsn), **settings)


class TestLookupsTogether(OwnStore):
    """Token and standing lookups of one reactor turn go on, after the first, as one statement."""

    @pytest_twisted.ensureDeferred
    async def test_lookups_waiting_together_go_as_one_statement(self, monkeypatch):
        store = self.store(pool_size=4)
        grant = await start_grant(store, "g1")
        issued = [await issue(store, grant, str(n)) for n in range(10)]
        tokens = [access for access, _ in issued]
        statements = []
        run = store._pool.run
        monkeypatch.setattr(
            store._pool, "run", lambda work, label="", **kw: (statements.append(label), run(work, label, **kw))[1])
        with psycopg2.connect(self.dsn) as locker, locker.cursor() as cursor:
            # The first statements wait at the server until every lookup has been asked.
            cursor.execute("LOCK TABLE access_tokens IN ACCESS EXCLUSIVE MODE")
            cursor.execute("LOCK TABLE refresh_tokens IN ACCESS EXCLUSIVE MODE")
            cursor.execute("LOCK TABLE authorization_codes IN ACCESS EXCLUSIVE MODE")
            found = gatherResults(
                [store.find_access_token(token.token_hash, NOW) for token in tokens]
                + [store.find_access_token(h("unknown"), NOW)]
                + [store.access_state(sub, NOW) for sub in (ALICE, BOB) * 5]
                + [store.get_refresh_token(refresh.token_hash) for _, refresh in issued]
                + [store.find_code(code_hash, NOW) for code_hash in (h("code-g1"), h("unknown")) * 3]
            )
        assert await found == tokens + [None] + [AccessState(ban=None, has_active_grant=True),
                                                 AccessState(ban=None, has_active_grant=False)] * 5 + [
                                                 refresh for _, refresh in issued] + [
                                                 CodeFound(make_code("code-g1", grant), grant), CodeNotFound()] * 3
        assert sorted(statements) == (["access_state"] * 2 + ["find_access_token"] * 2 + ["find_code"] * 2
                                      + ["get_refresh_token"] * 2)
        await store.close()

    @pytest_twisted.ensureDeferred
    async def test_a_key_no_text_can_hold_matches_nothing_and_spoils_no_group(self):
        """
        A user id with a lone surrogate or a NUL (both possible in a JSON
        string) is no stored user: it is answered as unknown before it could
        fail, in the driver, the statement it would have gone with.
        """
        store = self.store(pool_size=2)
        grant = await start_grant(store, "g1")
        access, refresh = await issue(store, grant, "1")
        strange = ["\ud800", "a\x00", "\udfff" + ALICE, "ß\ud83d"]
        found = await gatherResults(
            [store.access_state(sub, NOW) for sub in [ALICE, *strange, ALICE]]
            + [store.find_access_token(key, NOW) for key in [access.token_hash, *strange, access.token_hash]]
            + [store.get_refresh_token(key) for key in [refresh.token_hash, *strange, refresh.token_hash]]
        )
        live, none = AccessState(ban=None, has_active_grant=True), AccessState(ban=None, has_active_grant=False)
        assert found == [live, *[none] * 4, live] + [access, *[None] * 4, access] + [refresh, *[None] * 4, refresh]
        await store.close()

    @pytest_twisted.ensureDeferred
    async def test_lookups_waiting_together_share_the_outage(self):
        from twisted.internet import reactor
        from twisted.internet.protocol import Factory, Protocol

        gone = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
        port = gone.getHost().port
        await gone.stopListening()
        store = self.store(dsn=f"host=127.0.0.1 port={port} dbname=x connect_timeout=1")
        found = await DeferredList(
            [store.find_access_token(h(f"access-{n}"), NOW) for n in range(6)]
            + [store.access_state(ALICE, NOW) for _ in range(6)]
            + [store.get_refresh_token(h(f"refresh-{n}")) for n in range(6)], consumeErrors=True)
        assert [(ok, type(outcome.value)) for ok, outcome in found] == [(False, StoreUnavailable)] * 18
        await store.close()


class TestConnectionFailures(OwnStore):
    """Every failure is StoreUnavailable within the configured time, and the pool carries on."""

    @contextlib.asynccontextmanager
    async def bans_held(self, store):
        """A ban stored, then its row held by another session, so the store's statements on it wait."""
        await store.ban_user(Ban(ALICE, "first", NOW))
        with psycopg2.connect(self.dsn) as locker, locker.cursor() as cursor:
            cursor.execute("SELECT * FROM bans FOR UPDATE")
            yield locker

    @pytest_twisted.ensureDeferred
    async def test_statement_timeout_then_the_connection_serves_again(self):
        from twisted.internet import reactor

        store = self.store()
        async with self.bans_held(store):
            start = reactor.seconds()
            with pytest.raises(StoreUnavailable):
                await store.ban_user(Ban(ALICE, "second", NOW))
            assert 1 <= _elapsed_since(start) < 2.5
            assert (await store.get_ban(ALICE, NOW)).reason == "first"
        await store.ban_user(Ban(ALICE, "third", NOW))
        assert (await store.get_ban(ALICE, NOW)).reason == "third"
        await store.close()

    @pytest_twisted.ensureDeferred
    async def test_server_that_stops_answering_mid_statement(self):
        """A frozen backend cannot enforce statement_timeout: the client's deadline closes the connection."""
        from twisted.internet import reactor

        store = self.store(dsn=self.dsn + " application_name=frozen-test")
        await store.ping()
        with psycopg2.connect(self.dsn) as admin, admin.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'frozen-test'")
            (backend,) = cursor.fetchone()
        os.kill(backend, signal.SIGSTOP)
        try:
            start = reactor.seconds()
            with pytest.raises(StoreUnavailable):
                await store.get_ban(ALICE, NOW)
            assert 2 <= _elapsed_since(start) < 3.5
        finally:
            os.kill(backend, signal.SIGCONT)
        assert await store.get_ban(ALICE, NOW) is None
        await store.close()

    @pytest_twisted.ensureDeferred
    async def test_a_backend_ended_mid_statement_fails_at_once_and_the_pool_carries_on(self):
        """
        The server closing the socket under a query fails that query now, not
        at the deadline, and the connection's descriptors are all closed.
        """
        from twisted.internet import reactor

        store = self.store(dsn=self.dsn + " application_name=ended-test", statement_timeout=5)
        await store.ban_user(Ban(ALICE, "first", NOW))
        (connection,) = store._pool._open
        watched = connection.fileno(), os.fstat(connection.fileno()).st_ino
        with psycopg2.connect(self.dsn) as locker, locker.cursor() as cursor:
            cursor.execute("SELECT * FROM bans FOR UPDATE")
            blocked = store.ban_user(Ban(ALICE, "second", NOW))
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'ended-test'")
            (backend,) = cursor.fetchone()
            start = reactor.seconds()
            cursor.execute("SELECT pg_terminate_backend(%s)", (backend,))
            with pytest.raises(StoreUnavailable):
                await blocked
            assert _elapsed_since(start) < 2
        locker.close()
        assert (await store.get_ban(ALICE, NOW)).reason == "first"
        await store.close()
        with contextlib.suppress(OSError):
            assert os.fstat(watched[0]).st_ino != watched[1], "the socket the reactor watched is still open"

    @pytest_twisted.ensureDeferred
    async def test_backends_ended_while_idle_fail_no_request(self, monkeypatch):
        """
        A restart or pg_terminate_backend ends idle connections before the
        reactor reads it: a read on one runs again on a live connection, a
        write gets a connection whose socket was looked at first; reads on
        live connections never look.
        """
        store = self.store(dsn=self.dsn + " application_name=idle-test", pool_size=3)
        await store.ban_user(Ban(ALICE, "first", NOW))
        await gatherResults([store.get_ban(ALICE, NOW) for _ in range(3)])
        with psycopg2.connect(self.dsn) as admin, admin.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                           " WHERE application_name = 'idle-test'")
        admin.close()
        time.sleep(0.2)  # the goodbyes arrive while the reactor is busy elsewhere
        bans = await gatherResults([store.get_ban(ALICE, NOW), store.list_bans(NOW)])
        assert bans[0].reason == "first" and [ban.reason for ban in bans[1]] == ["first"]
        assert (await store.find_access_token(h("access-1"), NOW)) is None
        with psycopg2.connect(self.dsn) as admin, admin.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                           " WHERE application_name = 'idle-test'")
        admin.close()
        time.sleep(0.2)
        assert await store.unban_user(ALICE) is True
        looked = []
        monkeypatch.setattr(pool.select, "poll", lambda: looked.append(1))
        assert await gatherResults([store.get_ban(ALICE, NOW), store.find_access_token(h("a"), NOW)]) == [None] * 2
        assert looked == []
        await store.close()

    def end_backends(self, application_name: str) -> int:
        """pg_terminate_backend on every session of C{application_name}, as an operator would; how many."""
        with psycopg2.connect(self.dsn) as admin, admin.cursor() as cursor:
            cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                           " WHERE application_name = %s", (application_name,))
            (ended,) = cursor.fetchone()
        admin.close()
        return ended

    def live_backends(self, application_name: str) -> set[int]:
        with psycopg2.connect(self.dsn) as admin, admin.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,))
            pids = {pid for (pid,) in cursor.fetchall()}
        admin.close()
        return pids

    @pytest_twisted.ensureDeferred
    async def test_reads_right_after_pg_terminate_backend_answer_from_new_connections(self):
        """
        The hot lookups sent at once after the server ended every pooled
        connection, their goodbyes still on the way, each run once more on a
        new connection: none fails, and no connection the server ended serves
        again. Several rounds, since how far the goodbyes got varies.
        """
        store = self.store(dsn=self.dsn + " application_name=terminated-test", pool_size=4)
        grant = await start_grant(store, "g1")
        access, refresh = await issue(store, grant, "1")
        await store.ban_user(Ban(BOB, "spam", NOW))
        for _ in range(15):
            await gatherResults([store.list_bans(NOW) for _ in range(4)])
            assert self.end_backends("terminated-test") >= 1
            found = [
                await store.find_access_token(access.token_hash, NOW), await store.access_state(ALICE, NOW),
                await store.get_refresh_token(refresh.token_hash), await store.get_ban(BOB, NOW),
            ]
            assert found[:3] == [access, AccessState(ban=None, has_active_grant=True), refresh]
            assert found[3].reason == "spam"
            kept = {connection.get_backend_pid() for connection in store._pool._open}
            assert kept <= self.live_backends("terminated-test"), "a connection the server ended is kept"
        await store.close()

    @pytest_twisted.ensureDeferred
    async def test_a_read_whose_backend_is_ended_mid_statement_runs_again(self):
        """
        A read under way when its session is ended runs once more, on a new
        connection (a write never does: see
        test_a_backend_ended_mid_statement_fails_at_once_and_the_pool_carries_on).
        """
        store = self.store(dsn=self.dsn + " application_name=mid-read-test", statement_timeout=5)
        await store.ban_user(Ban(ALICE, "first", NOW))
        with psycopg2.connect(self.dsn) as locker, locker.cursor() as cursor:
            cursor.execute("LOCK TABLE bans IN ACCESS EXCLUSIVE MODE")
            reading = store.get_ban(ALICE, NOW)
            assert self.end_backends("mid-read-test") == 1
        locker.close()
        assert (await reading).reason == "first"
        await store.close()

    @pytest_twisted.ensureDeferred
    async def test_a_connection_the_server_refuses_while_it_stops_is_no_unhandled_error(self, logged):
        """
        A server that closes the connection during its start-up (a database
        shutting down, a crash) fails that attempt; txpostgres would then
        watch the socket libpq has closed, an unhandled error in the log.
        """
        from twisted.internet import reactor
        from twisted.internet.protocol import Factory, Protocol

        class Hangup(Protocol):
            def dataReceived(self, data):
                self.transport.loseConnection()

        hanging_up = reactor.listenTCP(0, Factory.forProtocol(Hangup), interface="127.0.0.1")
        store = self.store(dsn=f"host=127.0.0.1 port={hanging_up.getHost().port} dbname=x sslmode=disable")
        try:
            for _ in range(3):
                with pytest.raises(StoreUnavailable):
                    await store.ping()
        finally:
            await store.close()
            await hanging_up.stopListening()
        assert not [event for event in logged if event.get("isError") or "log_failure" in event]

    @pytest_twisted.ensureDeferred
    async def test_queries_leave_the_reactors_watch_on_the_socket_alone(self, monkeypatch):
        """
        The connection stays the reader of its socket and hands each reply to
        the cursor under way: txpostgres's hand-over per query (socket taken
        from the connection, given to the cursor and back) was four changes
        to the reactor's interest set per query.
        """
        from twisted.internet import reactor

        store = self.store()
        await store.ping()
        changes = []
        for method in ("addReader", "removeReader", "addWriter", "removeWriter"):
            original = getattr(reactor, method)
            monkeypatch.setattr(reactor, method, lambda s, m=method, o=original: (changes.append(m), o(s))[1])
        await store.ban_user(Ban(ALICE, "spam", NOW))
        for n in range(10):
            assert await store.find_access_token(h(f"access-{n}"), NOW) is None
        assert (await store.get_ban(ALICE, NOW)).reason == "spam"
        monkeypatch.undo()
        assert changes == []
        await store.close()

    @pytest_twisted.ensureDeferred
    async def test_server_that_never_answers_the_connection(self):
        from twisted.internet import reactor
        from twisted.internet.protocol import Factory, Protocol

        silent = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
        store = self.store(dsn=f"host=127.0.0.1 port={silent.getHost().port} dbname=x connect_timeout=10")
        try:
            start = reactor.seconds()
            with pytest.raises(StoreUnavailable):
                await store.ping()
            assert 1 <= _elapsed_since(start) < 2.5
        finally:
            await store.close()
            await silent.stopListening()

    @pytest_twisted.ensureDeferred
    async def test_waiting_for_a_busy_pool_is_bounded(self):
        from twisted.internet import reactor

        store = self.store(statement_timeout=3)
        async with self.bans_held(store):
            blocked = store.unban_user(ALICE)
            start = reactor.seconds()
            with pytest.raises(StoreUnavailable, match="no PostgreSQL connection became free"):
                await store.ping()
            assert 1 <= _elapsed_since(start) < 2.5
        assert await blocked is True
        await store.close()

    @pytest_twisted.ensureDeferred
    async def test_statements_share_one_deadline_watch(self, monkeypatch):
        """
        Each statement's deadline is watched by the pool's one timer, not a
        timer of its own (a delayed call scheduled and cancelled per
        statement, and a coroutine around it, were a sixth of a lookup's
        client-side cost), waiting for a connection included.
        """
        from twisted.internet import reactor

        store = self.store(pool_size=2)
        await gatherResults([store.ping(), store.ping()])
        scheduled = []
        call_later = reactor.callLater
        monkeypatch.setattr(reactor, "callLater", lambda *a, **k: (scheduled.append(a[1]), call_later(*a, **k))[1])
        for n in range(10):
            assert await store.get_ban(f"user-{n}", NOW) is None
        assert await gatherResults([store.get_ban(f"user-{n}", NOW) for n in range(10)]) == [None] * 10
        monkeypatch.undo()
        assert len(scheduled) <= 1
        await store.close()

    @pytest_twisted.ensureDeferred
    async def test_a_connection_runs_its_statements_on_one_cursor(self, monkeypatch):
        store = self.store()
        await store.ping()
        made = []
        init = pool._Cursor.__init__
        monkeypatch.setattr(pool._Cursor, "__init__", lambda *a: (made.append(a), init(*a))[1])
        await store.ban_user(Ban(ALICE, "spam", NOW))
        assert (await store.get_ban(ALICE, NOW)).reason == "spam"
        assert await store.unban_user(ALICE) is True
        assert await store.get_ban(ALICE, NOW) is None
        assert made == []
        await store.close()

    @pytest_twisted.ensureDeferred
    async def test_a_caller_that_stops_waiting_for_a_connection_leaves_the_queue(self):
        store = self.store(statement_timeout=3)
        async with self.bans_held(store) as locker:
            blocked = store.unban_user(ALICE)
            given_up = store.get_ban(ALICE, NOW)
            waiting = store.get_ban(ALICE, NOW)
            given_up.cancel()
            with pytest.raises(CancelledError):
                await given_up
            assert [w.result for w in store._pool._waiting] == [waiting]
            locker.rollback()
        assert await blocked is True
        assert await waiting is None
        assert await store.get_ban(ALICE, NOW) is None
        await store.close()

    @pytest_twisted.ensureDeferred
    async def test_a_caller_that_gives_up_is_no_outage(self, logged):
        """
        A request whose client hung up cancels its store calls: the one under
        way loses its connection (the statement cannot be taken back), the one
        waiting leaves the queue, and neither is logged as the database being
        unavailable, nor answered as if it were.
        """
        store = self.store(pool_size=1, statement_timeout=3)
        async with self.bans_held(store) as locker:
            under_way = store.unban_user(ALICE)
            waiting = store.get_ban(ALICE, NOW)
            for call in (waiting, under_way):
                call.cancel()
                with pytest.raises(CancelledError):
                    await call
            locker.rollback()
        await store.ping()
        await store.close()
        lines = [formatEvent(event) for event in logged]
        assert not [line for line in lines if "PostgreSQL" in line], lines

    @pytest_twisted.ensureDeferred
    async def test_closing_fails_the_calls_waiting_for_a_connection(self):
        store = self.store(statement_timeout=3)
        async with self.bans_held(store):
            blocked = store.unban_user(ALICE)
            waiting = store.get_ban(ALICE, NOW)
            await store.close()
            with pytest.raises(StoreUnavailable):
                await waiting
            with pytest.raises(StoreUnavailable):
                await blocked

    @pytest_twisted.ensureDeferred
    async def test_closed_store_is_unavailable(self):
        store = self.store()
        await store.ping()
        await store.close()
        with pytest.raises(StoreUnavailable):
            await store.ping()

    @pytest_twisted.ensureDeferred
    async def test_refused_connection_logs_once_and_never_the_password(self, logged):
        store = self.store(dsn="host=127.0.0.1 port=1 dbname=x user=authsrv password=hunter2")
        for _ in range(3):
            with pytest.raises(StoreUnavailable) as info:
                await store.ping()
            assert "hunter2" not in str(info.value)
        await store.close()
        lines = [formatEvent(event) for event in logged]
        assert "hunter2" not in repr(lines)
        assert len([line for line in lines if "PostgreSQL unavailable" in line]) == 1

    @pytest_twisted.ensureDeferred
    async def test_observer_hears_every_call_by_label(self):
        heard = []
        store = self.store(observer=lambda *call: heard.append(call))
        await store.ban_user(Ban(ALICE, "spam", NOW))
        await store.find_access_token(h("access-1"), NOW)
        await store.close()
        with pytest.raises(StoreUnavailable):
            await store.ping()
        assert [(label, failed) for label, _, failed in heard] == [
            ("ban_user", False), ("find_access_token", False), ("ping", True),
        ]
        assert all(isinstance(seconds, float) and 0 <= seconds < 5 for _, seconds, _ in heard)

    @pytest_twisted.ensureDeferred
    async def test_keys_holding_nul_match_nothing(self):
        """PostgreSQL text cannot hold U+0000: such an id from a request is unknown, never an error."""
        store = self.store()
        try:
            assert await store.get_client("demo\x00") is None
            assert await store.get_client("demo\ud800") is None
            assert await store.get_ban("\udfffa", NOW) is None
            assert await store.access_state("\x00", NOW) == AccessState(ban=None, has_active_grant=False)
            assert await store.get_ban("a\x00", NOW) is None
            assert await store.get_interaction("ia\x00", NOW) is None
            assert await store.take_interaction("ia\x00", "login") is False
            assert await store.take_link_attempt(h("x"), "s\x00", NOW) is None
            assert await store.get_linked_account(ALICE, "discord\x00") is None
            assert await store.session_clients("sid\x00") == []
            assert await store.revoke_user_grants("\x00", NOW) == 0
            assert await store.revoke_token(h("x"), "demo\x00", NOW) == NotRevoked()
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_reconnect_attempts_never_pile_lookups_up_while_name_servers_hang(self):
        """
        In an outage whose name servers hang too, each reconnect attempt
        would queue one more lookup behind the hung one, each run long after
        its attempt gave up: an attempt's lookup that is still waiting when
        it times out is skipped, and once as many wait as the pool has
        connections, the next attempt is refused at once as the store being
        unavailable.
        """
        from twisted.internet import reactor

        hanging = Hanging()
        with one_thread(hanging) as threads:
            store = self.store(dsn="host=db.test port=1 dbname=x connect_timeout=1",
                               lookups=HostLookups(reactor, threads, 1, lookup=hanging))
            try:
                for _ in range(2):  # the first hangs on the one thread, the second waits behind it
                    with pytest.raises(StoreUnavailable, match="did not answer within 1s"):
                        await store.ping()
                with pytest.raises(StoreUnavailable, match="cannot look up the PostgreSQL host: host name lookups waiting for a thread: 1"):
                    await store.ping()
                hanging.release.set()
                await drained(threads)
                assert hanging.looked == ["db.test"]
            finally:
                await store.close()

    @pytest_twisted.ensureDeferred
    async def test_host_names_are_looked_up_off_the_reactor_thread(self, monkeypatch):
        """libpq would look names up itself, blocking every request while DNS is slow or down."""
        looked_up = []
        lookup = socket.getaddrinfo

        def getaddrinfo(host, *args, **kwargs):
            looked_up.append((host, threading.current_thread() is threading.main_thread()))
            if host == "db.invalid":
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return lookup("127.0.0.1", *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        port = psycopg2.extensions.parse_dsn(self.dsn)["port"]
        # Only this lookup knows db.test: libpq connects to the address it found.
        store = self.store(dsn=self.dsn.replace("host=127.0.0.1", "host=db.test"))
        try:
            assert await store.ping() is None
        finally:
            await store.close()
        store = self.store(dsn=f"host=db.invalid port={port} dbname=x")
        try:
            with pytest.raises(StoreUnavailable, match="cannot look up the PostgreSQL host"):
                await store.ping()
        finally:
            await store.close()
        assert looked_up == [("db.test", False), ("db.invalid", False)]

    def test_targets_of_a_dsn(self):
        assert targets("dbname=x") == [{}]
        assert targets("host=db.internal dbname=x") == [{"host": "db.internal"}]
        assert targets("postgresql://db1:5433,db2/authsrv?target_session_attrs=read-write") == [
            {"host": "db1", "port": "5433"}, {"host": "db2", "port": ""},
        ]
        assert targets("host=db1,db2 port=6432") == [
            {"host": "db1", "port": "6432"}, {"host": "db2", "port": "6432"},
        ]
        assert targets("host=db1,/run/postgresql hostaddr=10.0.0.5, port=5432,5433") == [
            {"host": "db1", "port": "5432", "hostaddr": "10.0.0.5"},
            {"host": "/run/postgresql", "port": "5433", "hostaddr": ""},
        ]

    @pytest_twisted.ensureDeferred
    async def test_a_silent_first_host_costs_one_connect_timeout(self):
        """A primary that went silent: the standby named next is still reached (libpq alone would wait)."""
        from twisted.internet import reactor
        from twisted.internet.protocol import Factory, Protocol

        silent = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
        port = psycopg2.extensions.parse_dsn(self.dsn)["port"]
        store = self.store(dsn=self.dsn.replace("host=127.0.0.1", "host=127.0.0.1,127.0.0.1").replace(
            f"port={port}", f"port={silent.getHost().port},{port}"))
        try:
            start = reactor.seconds()
            assert await store.ping() is None
            assert 1 <= _elapsed_since(start) < 2.5
        finally:
            await store.close()
            await silent.stopListening()


class TestRemovalBesideAGrant(OwnStore):
    """
    A client removed while another transaction starts a grant for it: of
    the two, whichever locked the client's row first goes first, and no
    grant of the removed client is left either way.
    """

    async def _waiting_for_a_lock(self, admin) -> None:
        """Until the store's statement waits for a row lock another connection holds (at most 10 s)."""
        from twisted.internet import reactor
        from twisted.internet.task import deferLater

        for _ in range(1000):
            with admin.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity"
                               " WHERE wait_event_type = 'Lock' AND datname = current_database()")
                if cursor.fetchone()[0]:
                    return
            await deferLater(reactor, 0.01, lambda: None)
        raise AssertionError("the store's statement never waited for the lock")

    @contextlib.asynccontextmanager
    async def _with_client(self):
        """A store holding the client, and a connection beside it (autocommit) to watch its waits."""
        store = self.store()
        with psycopg2.connect(self.dsn) as admin:
            admin.autocommit = True
            try:
                assert await store.add_client(Client(CLIENT, None, ["https://app.example/cb"])) is None
                yield store, admin
            finally:
                await store.close()

    def _open_transaction(self, sql: str, params) -> "psycopg2.extensions.connection":
        """A connection whose transaction ran C{sql} and holds its locks until it commits."""
        connection = psycopg2.connect(self.dsn)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            assert cursor.rowcount == 1
        return connection

    async def _after(self, admin, holder, pending: Deferred):
        """What C{pending} fires with once C{holder}, whose locks it waits for, commits."""
        await self._waiting_for_a_lock(admin)
        assert not pending.called
        holder.commit()
        holder.close()
        return await pending

    @pytest_twisted.ensureDeferred
    async def test_a_removal_waits_for_a_grant_started_beside_it_and_removes_it(self):
        grant = make_grant("g-beside")
        async with self._with_client() as (store, admin):
            insert = postgres_store.client_grant(postgres_store._T, postgres_store.POSTGRES, "g_")
            starting = self._open_transaction(insert, postgres_store._T.grants.params(grant, "g_"))
            assert await self._after(admin, starting, store.remove_client(CLIENT)) is True
            assert await store.get_grant("g-beside") is None

    @pytest_twisted.ensureDeferred
    async def test_a_removal_as_read_waits_for_a_change_beside_it_and_removes_nothing(self):
        """An operator's delete under If-Match, beside another instance's change: the change stays."""
        async with self._with_client() as (store, admin):
            read = await store.get_client(CLIENT)
            changing = self._open_transaction("UPDATE clients SET name = 'renamed' WHERE client_id = %s", (CLIENT,))
            assert await self._after(admin, changing, store.remove_client(CLIENT, read)) is False
            assert (await store.get_client(CLIENT)).name == "renamed"

    @pytest_twisted.ensureDeferred
    async def test_a_removal_as_read_waits_for_a_grant_started_beside_it_and_removes_it(self):
        grant = make_grant("g-beside")
        async with self._with_client() as (store, admin):
            read = await store.get_client(CLIENT)
            insert = postgres_store.client_grant(postgres_store._T, postgres_store.POSTGRES, "g_")
            starting = self._open_transaction(insert, postgres_store._T.grants.params(grant, "g_"))
            assert await self._after(admin, starting, store.remove_client(CLIENT, read)) is True
            assert await store.get_grant("g-beside") is None and await store.get_client(CLIENT) is None

    @pytest_twisted.ensureDeferred
    async def test_a_grant_started_beside_a_removal_waits_and_stores_nothing(self):
        grant = make_grant("g-late")
        async with self._with_client() as (store, admin):
            removing = self._open_transaction("DELETE FROM clients WHERE client_id = %s", (CLIENT,))
            assert await self._after(admin, removing, store.save_code(make_code("code-late", grant), grant)) is False
            assert await store.get_grant("g-late") is None


class TestPreparedLookups(PostgresDatabase):
    """
    The hot lookups and the token endpoint's writes are prepared once per
    connection and run by name, and
    keep working when the session loses them (a pooler that discards
    session state) or a migration changes the columns they select.
    """

    @pytest_twisted.ensureDeferred
    async def test_prepared_once_then_run_by_name_and_prepared_again_when_lost(self):
        from authsrv.testing.store import CLIENT, add_clients, make_access, make_grant

        store = open_store(self.dsn, pool_size=1)
        grant = make_grant("g1")
        access = make_access("access-1", grant)
        await add_clients(store, [CLIENT])
        assert await store.start_grant(grant, access) is True

        async def prepared(db) -> set[str]:
            rows = await fetch(db, "SELECT name FROM pg_prepared_statements")
            return {row["name"] for row in rows}

        assert await store.find_access_token(access.token_hash, NOW) == access
        assert "authsrv_find_access_token" in await store._pool.run(prepared)
        assert await store.access_state(ALICE, NOW) == AccessState(ban=None, has_active_grant=True)
        assert await store.find_access_token(access.token_hash, NOW) == access
        assert {"authsrv_find_access_token", "authsrv_access_state"} <= await store._pool.run(prepared)
        assert "authsrv_find_access_token_linked" not in await store._pool.run(prepared)
        found = await store.find_access_token(access.token_hash, NOW, link_provider="discord")
        assert (found, found.linked_user_id) == (access, None)
        assert "authsrv_find_access_token_linked" in await store._pool.run(prepared)

        await store._pool.run(lambda db: db.cursor().execute("DEALLOCATE ALL"))
        assert await store.find_access_token(access.token_hash, NOW) == access

        with psycopg2.connect(self.dsn) as admin, admin.cursor() as cursor:
            cursor.execute("ALTER TABLE access_tokens ADD COLUMN added_by_a_newer_instance TEXT")
        try:
            assert await store.find_access_token(access.token_hash, NOW) == access
        finally:
            with psycopg2.connect(self.dsn) as admin, admin.cursor() as cursor:
                cursor.execute("ALTER TABLE access_tokens DROP COLUMN added_by_a_newer_instance")
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_the_code_exchange_and_the_rotation_are_prepared(self):
        from authsrv.testing.store import make_access, make_refresh, start_grant

        store = open_store(self.dsn, pool_size=1)
        try:
            machine = make_grant("cc", sub="", sid=None)
            described = make_grant("g-described", client_id="https://app.example/client.json")
            assert await store.start_grant(machine, make_access("cc", machine)) is False
            assert await store.save_code(make_code("code-described", described), described,
                                         stored_client=False) is True
            for n, refresh in ((1, True), (2, False)):
                grant = await start_grant(store, f"g{n}")
                assert (await store.find_code(h(f"code-g{n}"), NOW)).grant == grant
                tokens = make_access(f"access-{n}", grant), make_refresh(f"refresh-{n}", grant) if refresh else None
                assert await store.redeem_code(h(f"code-g{n}"), *tokens, NOW) == CodeRedeemed()
            assert await store.rotate_refresh(
                h("refresh-1"), make_refresh("refresh-3", grant), make_access("access-3", grant), b"sealed", NOW, NOW
            ) == Rotated()
            rows = await store._pool.run(lambda db: fetch(db, "SELECT name FROM pg_prepared_statements"))
            assert {"authsrv_find_code", "authsrv_redeem_code", "authsrv_redeem_code_refresh",
                    "authsrv_rotate_refresh", "authsrv_save_code", "authsrv_save_code_unlisted",
                    "authsrv_start_grant"} <= {row["name"] for row in rows}
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_user_access_reads_only_the_users_live_tokens(self):
        """
        A user's spent grants (every sign-in leaves one) are never read: the
        query starts from the partial indexes of live tokens by user, and the
        session takes generic plans, so a plan made for one user's values is
        never a table scan for the next.
        """
        store = open_store(self.dsn, pool_size=1)
        spent = ("INSERT INTO grants (grant_id, client_id, sub, scope, resource, auth_time, created_at, expires_at)"
                 " SELECT 'g-' || n, 'c', CASE WHEN mod(n, 2) = 0 THEN 'alice' ELSE 'user-' || n END, 'openid', '{}',"
                 " 0, 0, %(far)s FROM generate_series(1, 2000) n")
        tokens = ("INSERT INTO {table} (token_hash, grant_id, client_id, sub, scope, {extra} issued_at, expires_at)"
                  " SELECT '{table}-' || grant_id, grant_id, client_id, sub, scope, {values} 0,"
                  " CASE WHEN sub = 'alice' THEN 1 ELSE %(far)s END FROM grants")
        with psycopg2.connect(self.dsn) as admin, admin.cursor() as cursor:
            cursor.execute(spent, {"far": NOW + 3600})
            cursor.execute(tokens.format(table="access_tokens", extra="audience,", values="'{}',"), {"far": NOW + 3600})
            cursor.execute(tokens.format(table="refresh_tokens", extra="", values=""), {"far": NOW + 3600})
            cursor.execute("ANALYZE")
        try:
            assert await store.access_state(ALICE, NOW) == AccessState(ban=None, has_active_grant=False)

            async def plan(db) -> str:
                assert (await first(db, "SHOW plan_cache_mode"))["plan_cache_mode"] == "force_generic_plan"
                rows = await fetch(db, "EXPLAIN EXECUTE authsrv_access_state (%(sub)s, %(now)s)",
                                   {"sub": ALICE, "now": NOW})
                return "\n".join(row["QUERY PLAN"] for row in rows)

            shown = await store._pool.run(plan)
            assert "access_tokens_live_sub" in shown and "refresh_tokens_live_sub" in shown, shown
            assert "on grants" not in shown.replace("grants_pkey on grants", ""), shown
        finally:
            await store.close()


ROWS = 5000
PAGE = 51
"""A page of the admin API's default 50, and the one more read to know whether another follows."""


def _copies(cursor, table: str, key: str, template: str, value_sql: str) -> None:
    """C{ROWS} copies of C{table}'s row whose C{key} is C{template}, each keyed C{value_sql} of n (1 to ROWS)."""
    cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
                   (table,))
    columns = [row[0] for row in cursor.fetchall()]
    chosen = ", ".join(value_sql if column == key else column for column in columns)
    cursor.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {chosen}"
                   f" FROM generate_series(1, {ROWS}) n, {table} WHERE {key} = %s", (template,))


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


class TestListsReadOnePage(PostgresDatabase):
    """
    The admin API's lists read one page, never every row: with 5,000 bans,
    clients, and grants and sessions of one user, each page is one statement
    LIMITed to the page and one more, which PostgreSQL runs as an index scan
    in the page's order that stops at the limit (no sort of every row).
    """

    @pytest_twisted.ensureDeferred
    async def test_a_page_is_one_limited_statement_read_by_an_index(self, monkeypatch):
        store = open_store(self.dsn)
        try:
            await page_templates(store)
            with psycopg2.connect(self.dsn) as admin, admin.cursor() as cursor:
                _copies(cursor, "bans", "sub", "template", "'user-' || lpad(n::text, 5, '0')")
                _copies(cursor, "clients", "client_id", "template", "'client-' || lpad(n::text, 5, '0')")
                _copies(cursor, "grants", "grant_id", "template", "'grant-' || lpad(n::text, 5, '0')")
                _copies(cursor, "grants", "grant_id", "bobs", "'bobs-' || lpad(n::text, 5, '0')")
                _copies(cursor, "browser_sessions", "session_hash", "template", "'sid-' || lpad(n::text, 5, '0')")
                _copies(cursor, "browser_sessions", "session_hash", "bobs", "'bobs-' || 'sid-' || lpad(n::text, 5, '0')")
                cursor.execute("UPDATE browser_sessions SET sid = session_hash")
                cursor.execute("ANALYZE")
            statements: list[tuple] = []

            def seen(db, sql, params=None):
                statements.append((sql, params))
                return fetch(db, sql, params)

            monkeypatch.setattr(postgres_store, "fetch", seen)
            pages = {
                "bans": (await store.list_bans(NOW, None, PAGE), await store.list_bans(NOW, "user-02500", PAGE)),
                "clients": (await store.list_clients(None, PAGE), await store.list_clients("client-02500", PAGE)),
                "grants": (await store.list_user_grants(ALICE, NOW, None, PAGE),
                           await store.list_user_grants(ALICE, NOW, (NOW, "grant-02500"), PAGE)),
                "sessions": (await store.list_user_sessions(ALICE, NOW, None, PAGE),
                             await store.list_user_sessions(ALICE, NOW, (NOW, "sid-02500"), PAGE)),
            }
        finally:
            await store.close()
        assert [len(first) + len(after) for first, after in pages.values()] == [2 * PAGE] * 4
        assert pages["bans"][1][0].sub == "user-02501" and pages["grants"][1][0].grant_id == "grant-02501"
        assert pages["sessions"][1][0].sid == "sid-02501"
        assert len(statements) == 8, statements
        with psycopg2.connect(self.dsn) as admin, admin.cursor() as cursor:
            for sql, params in statements:
                assert sql.endswith("LIMIT %(limit)s") and params["limit"] == PAGE, sql
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                nodes = list(_nodes(cursor.fetchone()[0][0]["Plan"]))
                assert nodes[0]["Node Type"] == "Limit", nodes
                assert not any(node["Node Type"] == "Sort" for node in nodes), nodes
                scans = [node for node in nodes if "Scan" in node["Node Type"]]
                assert [node["Node Type"] for node in scans] in (["Index Scan"], ["Index Only Scan"]), nodes
                assert scans[0]["Actual Rows"] <= PAGE and not scans[0].get("Rows Removed by Filter"), nodes
