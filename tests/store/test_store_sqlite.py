"""
The SQLite store: both conformance suites, then what only a file shows
(schema versions, durability, the config section, a second process).
"""

from __future__ import annotations

import json
import re
import resource
import signal
import sqlite3
import subprocess
import sys
import threading
from importlib import resources
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from authsrv.configsection import ConfigError, Section
from authsrv.context import PluginContext
from authsrv.migrations import schema_steps
from authsrv.plugins import find_factory
from authsrv.records import DEFAULT_GRANT_TYPES, Ban, Client, Replayed, Rotated
from authsrv.store import sqlite
from authsrv.store.errors import AlreadyExists, AlreadyLinked, StoreUnavailable
from authsrv.testing.store import (
    ALICE,
    CLIENT,
    KEPT_LINKS,
    NOW,
    OLDER_ROWS,
    SHARED_LINKS,
    StoreConcurrencyConformance,
    StoreConformance,
    check_older_rows,
    h,
    issue,
    kept_links,
    make_access,
    make_grant,
    make_linked,
    make_refresh,
    page_templates,
    start_grant,
)

LATEST_VERSION = max(
    int(entry.name[:3])
    for entry in resources.files("authsrv.store").joinpath("schema", "sqlite").iterdir()
    if entry.name.endswith(".sql")
)


def _write_shared_links(db) -> None:
    """L{SHARED_LINKS}, written as an older release let two users share one provider account."""
    db.executemany(
        "INSERT INTO linked_accounts (account_id, sub, provider, provider_user_id, access_token_enc, scope,"
        " expires_at, updated_at, version) VALUES (?, ?, ?, ?, x'00', 'identify', 0, ?, 1)",
        SHARED_LINKS,
    )


class SQLiteFolder:
    """Opens stores on files in a fresh folder, each with its own thread pool."""

    @pytest.fixture(autouse=True)
    def _folder(self, tmp_path):
        self.folder = tmp_path
        self.contexts = []
        yield
        for context in self.contexts:
            context.stop()

    def open_store(self, **section):
        from twisted.internet import reactor

        context = PluginContext(reactor, self.folder)
        self.contexts.append(context)
        return sqlite.from_config(Section(section, "store", self.folder), context)


class TestSQLiteStore(SQLiteFolder, StoreConformance):
    def make_store(self):
        return self.open_store()


class TestSQLiteConcurrency(SQLiteFolder, StoreConcurrencyConformance):
    def make_store_pair(self):
        return self.open_store(), self.open_store()


def _version(path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]


def _older_schema(path, steps) -> sqlite3.Connection:
    """A database with only C{steps} of the schema applied, as an older release left it."""
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
    )
    for version, name, script in steps:
        db.executescript(script)
        db.execute("INSERT INTO schema_version VALUES (?, ?, 0)", (version, name))
    return db


def _write_older_rows(db: sqlite3.Connection) -> set[str]:
    """
    L{OLDER_ROWS} as an older release wrote them, lists as JSON text,
    each with its table's columns at this version; the tables written.
    """
    written = set()
    for table, row in OLDER_ROWS:
        columns = {column[1] for column in db.execute(f"PRAGMA table_info({table})")}
        if columns:
            row = {name: value for name, value in row.items() if name in columns}
            db.execute(
                f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                [json.dumps(value) if isinstance(value, list) else value for value in row.values()],
            )
            written.add(table)
    return written


class TestSQLiteFile(SQLiteFolder):
    @pytest_twisted.ensureDeferred
    async def test_plugin_creates_folder_and_current_schema(self):
        from twisted.internet import reactor

        context = PluginContext(reactor, self.folder)
        self.contexts.append(context)
        section = Section({"path": "data/store/authsrv.sqlite3"}, "store", self.folder)
        store = find_factory("store", "sqlite").from_config(section, context)
        await store.close()
        path = self.folder / "data" / "store" / "authsrv.sqlite3"
        assert _version(path) == LATEST_VERSION
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    def test_savepoint_undo_pages_stay_in_memory(self):
        """
        Each write of a group commit has its own savepoint; the pages it
        changes after an earlier write changed them are saved for its
        rollback in a statement journal, which past 64 KiB must not spill to
        a temporary file (a pwrite per page, dozens per request in a busy
        group commit).
        """
        db = sqlite._open(self.folder / "authsrv.sqlite3", "full", NOW)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("SAVEPOINT write_0")
            db.executemany("INSERT INTO bans (sub, reason, created_at) VALUES (?, ?, 0)",
                           [(f"user-{n}", "x" * 1000) for n in range(100)])
            db.execute("RELEASE write_0")
            # Past SQLite's 64 KiB of statement journal kept in memory by default.
            db.execute("SAVEPOINT write_1")
            db.execute("UPDATE bans SET reason = 'y'")
            open_files = [str(path.readlink()) for path in Path("/proc/self/fd").iterdir() if path.is_symlink()]
            db.execute("RELEASE write_1")
            db.execute("COMMIT")
        finally:
            db.close()
        assert not [name for name in open_files if "/etilqs_" in name]

    @pytest_twisted.ensureDeferred
    async def test_default_path_and_normal_synchronous(self):
        store = self.open_store(synchronous="normal")
        await store.ban_user(Ban(ALICE, None, NOW))
        await store.close()
        assert _version(self.folder / "authsrv.sqlite3") == LATEST_VERSION

    @pytest_twisted.ensureDeferred
    async def test_reopening_keeps_data_and_version(self):
        client = Client(CLIENT, h("secret"), ["https://app.example/cb"], name="Demo")
        store = self.open_store()
        await store.add_client(client)
        grant = await start_grant(store, "g1")
        access, refresh = await issue(store, grant, "1")
        await store.close()

        store = self.open_store()
        try:
            assert await store.get_client(CLIENT) == client
            assert await store.get_grant("g1") == grant
            assert await store.find_access_token(access.token_hash, NOW) == access
            assert await store.get_refresh_token(refresh.token_hash) == refresh
        finally:
            await store.close()
        with sqlite3.connect(self.folder / "authsrv.sqlite3") as db:
            assert db.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == len(schema_steps("authsrv.store", "sqlite"))

    @pytest_twisted.ensureDeferred
    async def test_upgrade_gives_existing_clients_the_default_grant_types(self):
        with _older_schema(self.folder / "authsrv.sqlite3", schema_steps("authsrv.store", "sqlite")[:2]) as db:
            db.execute(
                "INSERT INTO clients VALUES ('old-app', NULL, '[\"https://old.example/cb\"]', '[]', '', 0, 0, '[]', 0, NULL, 0)"
            )
        store = self.open_store()
        try:
            assert (await store.get_client("old-app")).grant_types == DEFAULT_GRANT_TYPES
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_upgrade_keeps_one_link_of_each_provider_account(self):
        """Links an older release let two users share do not stop the upgrade (docs/design.md)."""
        before = [step for step in schema_steps("authsrv.store", "sqlite") if step[0] < 23]
        with _older_schema(self.folder / "authsrv.sqlite3", before) as db:
            _write_shared_links(db)
        store = self.open_store()
        try:
            assert await kept_links(store) == KEPT_LINKS
            with pytest.raises(AlreadyLinked):
                await store.link_account(make_linked("acct-later", sub=ALICE))
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_upgrade_keeps_refresh_tokens_in_an_ordinary_table(self):
        """
        A rotated token's sealed replay no longer spills out of its row: the
        table is rebuilt with a rowid, its tokens, replays, indexes and the
        cascade from their grant kept.
        """
        before = [step for step in schema_steps("authsrv.store", "sqlite") if step[0] < 21]
        assert before[-1][1] == "020_passkey_challenges_signed.sql"
        with _older_schema(self.folder / "authsrv.sqlite3", before) as db:
            db.execute(
                "INSERT INTO grants (grant_id, client_id, sub, scope, resource, auth_time, created_at, expires_at)"
                " VALUES ('g1', ?, ?, 'openid offline_access', '[]', ?, ?, ?)",
                (CLIENT, ALICE, NOW, NOW, NOW + 3600),
            )
            rows = [(h("refresh-live"), None, None, None, "jkt-1"), (h("refresh-used"), NOW, NOW + 10, b"sealed", None)]
            for token_hash, consumed_at, grace_until, replay, jkt in rows:
                db.execute(
                    "INSERT INTO refresh_tokens (token_hash, grant_id, client_id, sub, scope, issued_at, expires_at,"
                    " consumed_at, grace_until, replay, jkt) VALUES (?, 'g1', ?, ?, 'openid offline_access', ?, ?,"
                    " ?, ?, ?, ?)",
                    (token_hash, CLIENT, ALICE, NOW, NOW + 3600, consumed_at, grace_until, replay, jkt),
                )
            assert "WITHOUT ROWID" in db.execute(
                "SELECT sql FROM sqlite_master WHERE name = 'refresh_tokens'").fetchone()[0]
        store = self.open_store()
        try:
            live = await store.get_refresh_token(h("refresh-live"))
            assert (live.grant_id, live.scope, live.jkt, live.consumed_at) == (
                "g1", frozenset({"openid", "offline_access"}), "jkt-1", None)
            used = await store.get_refresh_token(h("refresh-used"))
            assert (used.consumed_at, used.grace_until, used.replay) == (NOW, NOW + 10, b"sealed")
            grant = make_grant("g1")
            rotated = await store.rotate_refresh(
                h("refresh-live"), make_refresh("refresh-next", grant), make_access("access-next", grant), b"again",
                NOW + 10, NOW + 1)
            assert rotated == Rotated()
            assert await store.rotate_refresh(
                h("refresh-live"), make_refresh("refresh-other", grant), make_access("access-other", grant), b"no",
                NOW + 11, NOW + 2) == Replayed(b"again")
        finally:
            await store.close()
        with sqlite3.connect(self.folder / "authsrv.sqlite3") as db:
            assert db.execute("SELECT count(rowid) FROM refresh_tokens").fetchone()[0] == 3
            indexes = {row[1] for row in db.execute("PRAGMA index_list(refresh_tokens)")}
            assert {"refresh_tokens_grant_id", "refresh_tokens_expires_at", "refresh_tokens_replay",
                    "refresh_tokens_live_sub"} < indexes
            db.execute("PRAGMA foreign_keys = ON")
            db.execute("DELETE FROM grants WHERE grant_id = 'g1'")
            assert db.execute("SELECT count(*) FROM refresh_tokens").fetchone()[0] == 0

    @pytest.mark.parametrize("older", [2, 11, 17, 21, 23])
    @pytest_twisted.ensureDeferred
    async def test_rows_written_at_an_older_version_work_after_the_upgrade(self, older):
        """
        From the first version, the first with passkeys, and from just
        before each step that rebuilds a table or adds an index over
        existing rows.
        """
        before = [step for step in schema_steps("authsrv.store", "sqlite") if step[0] < older]
        with _older_schema(self.folder / "authsrv.sqlite3", before) as db:
            written = _write_older_rows(db)
        store = self.open_store()
        try:
            await check_older_rows(store, written)
        finally:
            await store.close()

    def test_a_step_that_fails_leaves_the_older_version_whole(self):
        """
        An index of the operator's own under the name a later step creates
        stops that step: the steps before it in the same upgrade are undone
        too (a column added, duplicate links deleted), and the start stops
        with one line naming the step.
        """
        path = self.folder / "authsrv.sqlite3"
        with _older_schema(path, [step for step in schema_steps("authsrv.store", "sqlite") if step[0] < 22]) as db:
            _write_shared_links(db)
            db.execute("CREATE INDEX clients_source ON clients (name)")
        with pytest.raises(ConfigError) as info:
            self.open_store()
        assert info.value.key == "store.path"
        assert info.value.problem == (
            f"cannot use {path}: its store schema step 024_clients_source.sql failed:"
            " index clients_source already exists; the schema stays at version 21"
        )
        with sqlite3.connect(path) as db:
            assert _version(path) == 21
            assert "hinted_sub" not in {row[1] for row in db.execute("PRAGMA table_info(interactions)")}
            assert db.execute("SELECT count(*) FROM linked_accounts").fetchone()[0] == len(SHARED_LINKS)

    def test_newer_schema_is_refused(self):
        self.open_store()
        path = self.folder / "authsrv.sqlite3"
        with sqlite3.connect(path) as db:
            db.execute("INSERT INTO schema_version VALUES (?, 'from the future', 0)", (LATEST_VERSION + 1,))
        with pytest.raises(ConfigError) as info:
            self.open_store()
        assert info.value.key == "store.path"
        assert f"schema version {LATEST_VERSION + 1} is newer" in info.value.problem
        assert str(path) in info.value.problem

    def test_unknown_key_is_named(self):
        with pytest.raises(ConfigError) as info:
            self.open_store(path="authsrv.sqlite3", jounral_mode="wal")
        assert (info.value.key, info.value.problem) == ("store.jounral_mode", "unknown key")
        assert not (self.folder / "authsrv.sqlite3").exists()

    def test_bad_synchronous_is_named(self):
        with pytest.raises(ConfigError) as info:
            self.open_store(synchronous="off")
        assert info.value.key == "store.synchronous"

    def test_file_that_is_not_a_database(self):
        (self.folder / "notes.txt").write_text("not a database, " * 100)
        with pytest.raises(ConfigError) as info:
            self.open_store(path="notes.txt")
        assert info.value.key == "store.path"
        assert "notes.txt" in info.value.problem

    def test_path_that_is_a_folder(self):
        (self.folder / "taken").mkdir()
        with pytest.raises(ConfigError) as info:
            self.open_store(path="taken")
        assert info.value.key == "store.path"

    def test_parent_that_cannot_be_created(self):
        (self.folder / "file").write_text("")
        with pytest.raises(ConfigError) as info:
            self.open_store(path="file/authsrv.sqlite3")
        assert info.value.key == "store.path"

    def test_a_file_that_cannot_be_created_is_one_line(self):
        """
        The system refusing the file (a folder the service's user may not
        write to; here a name too long, as root may write anywhere) stopped
        the start with a traceback.
        """
        name = "a" * 300 + ".sqlite3"
        with pytest.raises(ConfigError) as info:
            self.open_store(path=name)
        assert info.value.key == "store.path"
        assert info.value.problem == f"cannot use {self.folder / name}: File name too long"

    @pytest_twisted.ensureDeferred
    async def test_waits_for_another_process_write(self):
        """Another connection (the operator command) may hold the write lock: the store waits, not fails."""
        from twisted.internet import reactor

        store = self.open_store()
        other = sqlite3.connect(self.folder / "authsrv.sqlite3", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO bans (sub, reason, created_at) VALUES ('bob', 'cli', 1)")
        written = store.ban_user(Ban(ALICE, None, NOW))
        pause = Deferred()
        reactor.callLater(0.2, pause.callback, None)
        await pause
        assert not written.called
        other.execute("COMMIT")
        other.close()
        await written
        try:
            assert [ban.sub for ban in await store.list_bans(NOW)] == [ALICE, "bob"]
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_a_new_file_another_process_writes_is_waited_for_not_refused(self):
        """
        Two processes starting at once on a new file (the server and the
        operator command): turning it to WAL takes a lock SQLite does not
        wait for, so the second one failed at once with "database is locked".
        """
        path = self.folder / "authsrv.sqlite3"
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("CREATE TABLE other (x)")
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO other VALUES (1)")
        released = threading.Timer(0.3, other.execute, ["COMMIT"])
        released.start()
        try:
            store = self.open_store()
        finally:
            released.join()
            other.close()
        try:
            assert await store.list_bans(NOW) == []
            assert _version(path) == LATEST_VERSION
        finally:
            await store.close()


_WRITE_THEN_DIE = """
import os, signal, sys
from pathlib import Path
from twisted.internet import task
from twisted.internet.defer import Deferred
from authsrv.configsection import Section
from authsrv.context import PluginContext
from authsrv.records import Ban
from authsrv.store import sqlite
from authsrv.testing.store import NOW, issue, start_grant

async def write(store):
    grant = await start_grant(store, "g1")
    await issue(store, grant, "1")
    await store.ban_user(Ban("alice", "kill -9", NOW))
    print("written", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

def main(reactor, folder):
    context = PluginContext(reactor, Path(folder))
    store = sqlite.from_config(Section({}, "store", Path(folder)), context)
    return Deferred.fromCoroutine(write(store))

task.react(main, sys.argv[1:])
"""


class TestSQLiteDurability(SQLiteFolder):
    @pytest_twisted.ensureDeferred
    async def test_write_survives_kill_9(self):
        """A write whose Deferred fired is on disk, even if the process dies at once."""
        child = subprocess.run(
            [sys.executable, "-c", _WRITE_THEN_DIE, str(self.folder)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr
        assert child.stdout == "written\n"
        store = self.open_store()
        try:
            assert (await store.get_ban("alice", NOW)).reason == "kill -9"
            assert (await store.get_grant("g1")).sub == ALICE
            assert await store.find_access_token(h("access-1"), NOW) is not None
            assert await store.get_refresh_token(h("refresh-1")) is not None
        finally:
            await store.close()


    @pytest_twisted.ensureDeferred
    async def test_a_full_disk_fails_writes_as_unavailable_and_the_store_carries_on(self):
        """
        The web layer answers StoreUnavailable with 503 and the endpoint's
        error shape; nothing half-written stays behind. A file size limit
        stands in for the full disk.
        """
        store = self.open_store()
        await store.ban_user(Ban(ALICE, "first", NOW))
        largest = max(path.stat().st_size for path in self.folder.iterdir())
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (largest, hard))
        try:
            with pytest.raises(StoreUnavailable):
                for n in range(100):
                    await store.ban_user(Ban(f"user-{n}-" + "x" * 4000, "spam" * 1000, NOW))
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        try:
            assert (await store.get_ban(ALICE, NOW)).reason == "first"
            await store.ban_user(Ban(ALICE, "after", NOW))
            assert (await store.get_ban(ALICE, NOW)).reason == "after"
        finally:
            await store.close()


class TestObserver(SQLiteFolder):
    @pytest_twisted.ensureDeferred
    async def test_observer_hears_every_call_by_label(self):
        from twisted.internet import reactor

        heard = []
        store = sqlite.open_store(reactor, self.folder / "observed.sqlite3", observer=lambda *call: heard.append(call))
        try:
            client = Client(CLIENT, None, ["https://app.example/cb"])
            await store.add_client(client)
            grant = await start_grant(store, "g1")
            await store.find_code(h("code-g1"), NOW)
            await store.redeem_code(h("code-g1"), make_access("access-1", grant), make_refresh("refresh-1", grant), NOW)
            await store.refuse_code(h("code-g1"), NOW)
            await store.get_refresh_token(h("refresh-1"))
            with pytest.raises(AlreadyExists):
                await store.add_client(client)
        finally:
            await store.close()
        assert [(label, failed) for label, _, failed in heard] == [
            ("add_client", False), ("get_client", False),
            ("save_code", False), ("find_code", False), ("redeem_code", False), ("refuse_code", False),
            ("get_refresh_token", False), ("add_client", True),
        ]
        assert all(isinstance(seconds, float) and 0 <= seconds < 5 for _, seconds, _ in heard)


class TestGroupCommit(SQLiteFolder):
    """Writes queued together commit together, each still all-or-nothing."""

    @pytest_twisted.ensureDeferred
    async def test_a_failing_write_rolls_back_alone(self):
        from twisted.internet.defer import DeferredList

        from authsrv.records import Client

        store = self.open_store()
        clients = [Client(client_id=f"c{n}", secret_hash=None, redirect_uris=["https://a.example/cb"])
                   for n in range(30)]
        await store.add_client(clients[7])
        results = await DeferredList([store.add_client(c) for c in clients], consumeErrors=True)
        failed = [n for n, (ok, _) in enumerate(results) if not ok]
        assert failed == [7]
        assert results[7][1].check(AlreadyExists)
        assert [c.client_id for c in await store.list_clients()] == sorted(c.client_id for c in clients)
        await store.close()
        reopened = self.open_store()
        assert len(await reopened.list_clients()) == 30
        await reopened.close()

    @pytest_twisted.ensureDeferred
    async def test_reads_do_not_queue_behind_a_commit_and_see_it_once_it_fired(self):
        """Reads run on their own connection: a write still syncing holds no lookup back."""
        import threading

        from authsrv.records import Client

        store = self.open_store()
        client = Client(client_id="c", secret_hash=None, redirect_uris=["https://a.example/cb"])
        syncing = threading.Event()
        held = store._worker.submit(True, lambda db: syncing.wait(10), ())
        write = store.add_client(client)
        assert await store.get_client("c") is None
        assert not held.called and not write.called
        syncing.set()
        await held
        await write
        assert await store.get_client("c") == client
        await store.close()


ROWS = 5000
PAGE = 51
"""A page of the admin API's default 50, and the one more read to know whether another follows."""


def _copies(db, table: str, key: str, template: str, value_sql: str) -> None:
    """C{ROWS} copies of C{table}'s row whose C{key} is C{template}, each keyed C{value_sql} of i (1 to ROWS)."""
    columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
    chosen = ", ".join(value_sql if column == key else column for column in columns)
    db.execute(f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {ROWS})"
               f" INSERT INTO {table} ({', '.join(columns)}) SELECT {chosen} FROM n, {table} WHERE {key} = ?",
               (template,))


class TestListsReadOnePage(SQLiteFolder):
    """
    The admin API's lists read one page, never every row: with 5,000 bans,
    clients, and grants and sessions of one user, each page is one statement
    LIMITed to the page and one more, which SQLite reads by an index in the
    page's order (a SEARCH, no sort of every row).
    """

    @pytest_twisted.ensureDeferred
    async def test_a_page_is_one_limited_statement_read_by_an_index(self):
        store = self.open_store()
        try:
            await page_templates(store)
            with sqlite3.connect(self.folder / "authsrv.sqlite3") as db:
                _copies(db, "bans", "sub", "template", "printf('user-%05d', i)")
                _copies(db, "clients", "client_id", "template", "printf('client-%05d', i)")
                _copies(db, "grants", "grant_id", "template", "printf('grant-%05d', i)")
                _copies(db, "grants", "grant_id", "bobs", "printf('bobs-%05d', i)")
                _copies(db, "browser_sessions", "session_hash", "template", "printf('sid-%05d', i)")
                _copies(db, "browser_sessions", "session_hash", "bobs", "'bobs-' || printf('sid-%05d', i)")
                db.execute("UPDATE browser_sessions SET sid = session_hash")
                db.execute("ANALYZE")
            statements: list[str] = []
            await store._reader.submit(False, lambda db: db.set_trace_callback(statements.append), ())
            pages = {
                "bans": (await store.list_bans(NOW, None, PAGE), await store.list_bans(NOW, "user-02500", PAGE)),
                "clients": (await store.list_clients(None, PAGE), await store.list_clients("client-02500", PAGE)),
                "grants": (await store.list_user_grants(ALICE, NOW, None, PAGE),
                           await store.list_user_grants(ALICE, NOW, (NOW, "grant-02500"), PAGE)),
                "sessions": (await store.list_user_sessions(ALICE, NOW, None, PAGE),
                             await store.list_user_sessions(ALICE, NOW, (NOW, "sid-02500"), PAGE)),
            }
            await store._reader.submit(False, lambda db: db.set_trace_callback(None), ())
        finally:
            await store.close()
        assert [len(first) + len(after) for first, after in pages.values()] == [2 * PAGE] * 4
        assert pages["bans"][1][0].sub == "user-02501" and pages["grants"][1][0].grant_id == "grant-02501"
        assert pages["sessions"][1][0].sid == "sid-02501"
        assert len(statements) == 8, statements
        with sqlite3.connect(self.folder / "authsrv.sqlite3") as db:
            for sql in statements:
                assert sql.endswith(f"LIMIT {PAGE}"), sql
                plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql)]
                assert len(plan) == 1 and re.match(r"SEARCH \w+ USING (PRIMARY KEY|INDEX \w+) \(", plan[0]), (sql, plan)
