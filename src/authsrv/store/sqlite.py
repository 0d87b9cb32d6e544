"""
The embedded store: one SQLite file, for a single server instance.

The one connection lives on one worker thread (L{SQLiteWorker}), so the
reactor never waits on the disk and the connection is never used by two
threads at once. Writes run in C{BEGIN IMMEDIATE} transactions, several
queued writes group-committed together, each in its own savepoint: SQLite
takes its write lock up front, so racing steps (code redemption, refresh
rotation, revocation, link leases) are decided one at a time, even against
another process on the same file (the operator command), which waits up to
the busy timeout.

The steps of a flow in progress (an interaction saved or used up, a code
saved, a browser session opened or touched, the sign-in throttle's counts,
a known device, a pushed request, a link attempt, a device authorization
and each of its device's polls) are written not durable: committed and
seen by every reader at once, but without waiting for the disk. Only a
crash of the machine (a power failure) loses them, and then only with
every write after them (the next durable commit syncs them all): the
person starts that sign-in again. Tokens, their redemption, rotation and
revocation, bans, consents, clients and keys wait for the disk.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import stat
from contextlib import contextmanager
from pathlib import Path
from time import monotonic, perf_counter, sleep

from twisted.internet.defer import succeed
from twisted.logger import Logger
from zope.interface import implementer

from authsrv.interfaces import IStore
from authsrv.migrations import Ledger, MigrationError, SQLiteMigration, migrate, schema_steps
from authsrv.interfaces import SERVER_KEY_BYTES
from authsrv.scheduling import one_core
from authsrv.records import (
    POLL_REDEEMED,
    POLL_REUSED,
    POLL_UNKNOWN,
    AccessState,
    Consent,
    NotRevoked,
    RefreshNotFound,
    Replayed,
    Reused,
    RevokedAccess,
    RevokedRefresh,
    Rotated,
    ThrottleDecision,
    TotpFactor,
)
from authsrv.store import codes, device, pending, throttle
from authsrv.store.codes import CodeNotFound, CodeRedeemed, CodeReused
from authsrv.store.errors import AlreadyExists, AlreadyLinked, StoreUnavailable
from authsrv.store.observer import Observer, watched
from authsrv.store.rows import (
    BEFORE_EVERY_ROW, SQLITE, Rows, access_state_sql, ban_of, banned, client_grant, displace_link, displaced, factors_of,
    import_statements, issuable, scope_text, tables, token_lookups, unencodable,
)
from authsrv.store.sqlite_worker import SQLiteWorker

_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
_BUSY_TIMEOUT_SECONDS = 5.0
_WAL_RETRY_SECONDS = 0.01

LEDGER = Ledger("schema_version", "store", named=True)

log = Logger()


def from_config(section, context) -> "SQLiteStore | None":
    """
    Open (creating it and its folder if needed) and migrate the database
    now, at start-up, so that a bad path or a too-new file stops the server
    with one line naming C{path}.
    """
    path = section.path_("path", "authsrv.sqlite3")
    synchronous = section.str("synchronous", "full", choices=tuple(_SYNCHRONOUS))
    section.done()
    if context.check_only:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise section.error("path", f"cannot create folder {path.parent}: {e.strerror}") from None
    try:
        store = open_store(context.reactor, path, _SYNCHRONOUS[synchronous], context.store_observer)
    except (sqlite3.Error, MigrationError) as e:
        raise section.error("path", f"cannot use {path}: {e}") from None
    except OSError as e:
        raise section.error("path", f"cannot use {path}: {e.strerror}") from None
    log.info("SQLite store {path} opened (synchronous = {synchronous!r})", path=str(path), synchronous=synchronous)
    return store


def open_store(reactor, path: Path, synchronous: str = "FULL", observer: Observer | None = None) -> "SQLiteStore":
    """The store on the file C{path}, opened and migrated now."""
    make_private(path)
    connection = _open(path, synchronous, int(reactor.seconds()))
    make_private(path)
    # Lookups are handed to their thread once per reactor turn; writes too on
    # one core, but with a core to spare a commit is better under way beside
    # the reactor at once (bench/README.md).
    writer = SQLiteWorker(reactor, connection, _store_error, f"authsrv-sqlite-{path.name}",
                          gather=one_core(), synchronous=synchronous)
    # The reader as a background thread; the writer not: as one, the code exchange
    # at c=1 was slower (bench/README.md, "The reader waits its turn").
    reader = SQLiteWorker(reactor, _open_reader(path), _store_error, f"authsrv-sqlite-read-{path.name}",
                          gather=True, background=True)
    return SQLiteStore(writer, observer, reader)


PRIVATE_SUFFIXES = ("", "-wal", "-shm", "-journal")
"""The database file and the files SQLite keeps beside it, all holding its rows."""


def make_private(path: Path) -> None:
    """
    Create the database file C{path} 0600 if it is missing, whatever the
    umask (SQLite gives its -wal and -shm files the database's mode), and
    narrow any of its files that group or others may read, with a warning.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
    for suffix in PRIVATE_SUFFIXES:
        member = path.with_name(path.name + suffix)
        try:
            mode = stat.S_IMODE(member.stat().st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            member.chmod(0o600)
            log.warn("{path} was accessible to group or others (mode {mode:04o}); it is now 0600",
                     path=str(member), mode=mode)


def _open(path: Path, synchronous: str, now: int) -> sqlite3.Connection:
    # Autocommit: transactions are only the explicit ones below. The busy
    # timeout lets another process (the operator command) finish its write.
    connection = sqlite3.connect(
        path, timeout=_BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False
    )
    try:
        connection.row_factory = sqlite3.Row
        _to_wal(connection)
        connection.execute(f"PRAGMA synchronous = {synchronous}")
        connection.execute("PRAGMA foreign_keys = ON")
        # Each write of a group commit runs in its own savepoint; past 64 KiB
        # SQLite spills the undo pages of savepoints (the statement journal)
        # to a temporary file, a pwrite per page, dozens per request in a busy
        # group commit.
        connection.execute("PRAGMA temp_store = MEMORY")
        migrate(connection, SQLiteMigration(), schema_steps("authsrv.store", "sqlite"), LEDGER, now)
    except BaseException:
        connection.close()
        raise
    return connection


def _to_wal(connection: sqlite3.Connection) -> None:
    """
    Put the file in WAL mode (once, when it is new), waiting up to the busy
    timeout for another process: SQLite does not wait for the lock this
    takes while the file is new and another process writes to it (two
    processes starting at once on it), but answers "database is locked".
    """
    deadline = monotonic() + _BUSY_TIMEOUT_SECONDS
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if e.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or monotonic() >= deadline:  # BUSY_* variants too
                raise
        sleep(_WAL_RETRY_SECONDS)


def _open_reader(path: Path) -> sqlite3.Connection:
    """
    A second connection for reads only: in WAL mode it reads the last
    committed state while the writer's COMMIT waits for the disk, so a
    lookup never queues behind another request's sync.
    """
    connection = sqlite3.connect(
        path, timeout=_BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False
    )
    connection.row_factory = sqlite3.Row
    connection.execute("PRAGMA query_only = ON")
    return connection


@contextmanager
def _transaction(connection: sqlite3.Connection):
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
        connection.execute("COMMIT")
    except BaseException:
        # SQLite rolls back by itself after some errors (disk full, I/O).
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


_T = tables(SQLITE)
_ACCESS_STATE = access_state_sql(SQLITE)
_IMPORT = import_statements(_T, SQLITE)
_THROTTLE = throttle.statements(SQLITE)
_BUSY_UNTIL = pending.busy_until(SQLITE)
_DEVICE = device.statements(SQLITE)
_CODES = codes.statements(_T, SQLITE)
_TOKENS = token_lookups(_T, SQLITE)
_CLIENT_GRANT = client_grant(_T, SQLITE)

_REVOKE_GRANT = "UPDATE grants SET revoked_at = ? WHERE grant_id = ? AND revoked_at IS NULL"
_LINKED_ELSEWHERE = "SELECT 1 FROM linked_accounts WHERE provider = ? AND provider_user_id = ? AND sub <> ?"
_DISPLACE = displace_link(SQLITE)


def _first(cursor: sqlite3.Cursor):
    """
    The first row, reading them all: a RETURNING statement left half-read
    would keep the transaction from committing.
    """
    rows = cursor.fetchall()
    return rows[0] if rows else None


# --- the store --------------------------------------------------------------


def _store_error(error: BaseException) -> BaseException:
    """The store's own exception for an SQLite one, or C{error} itself."""
    if isinstance(error, sqlite3.IntegrityError) and error.sqlite_errorname in (
        "SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE",
    ):
        return AlreadyExists(str(error))
    if isinstance(error, sqlite3.OperationalError):
        return StoreUnavailable(str(error))
    return error


def _unknown(params) -> bool:
    """Whether a lookup by C{params} (a dict or a sequence) names a key no stored text holds (L{unencodable})."""
    return unencodable(params.values() if isinstance(params, dict) else params)


@implementer(IStore)
class SQLiteStore:
    """
    L{IStore} on SQLite: writes on one connection owned by one
    L{SQLiteWorker} thread, reads on a read-only connection owned by another.
    """

    def __init__(self, worker: SQLiteWorker, observer: Observer | None = None, reader: SQLiteWorker | None = None):
        """
        C{observer}, if any, hears of every call (see L{authsrv.store.observer});
        without a C{reader}, reads run on the writer's thread.
        """
        self._worker = worker
        self._reader = reader or worker
        self._observer = observer

    def _call(self, label: str, write: bool, work, *args, durable: bool = True):
        """
        Fire with C{work(connection, *args)}: with C{write}, inside a
        (group-committed) write transaction on the writer's thread, else a
        read on the reader's. Every call passes here, named by C{label}.
        A write not C{durable} is a flow's step (module docstring).
        """
        return self._submit(label, self._worker if write else self._reader, write, work, args, durable)

    def _own_transactions(self, label: str, work, *args):
        """Work that opens its own write transactions, on the writer's thread outside any batch."""
        return self._submit(label, self._worker, False, work, args)

    def _submit(self, label: str, worker: SQLiteWorker, write: bool, work, args, durable: bool = True):
        if self._observer is None:
            return worker.submit(write, work, args, durable)
        return watched(self._observer, label, perf_counter(), worker.submit(write, work, args, durable))

    def _execute(self, label: str, sql: str, params=(), durable: bool = True):
        """Run one write statement; fire with how many rows it changed."""
        return self._call(label, True, lambda db: db.execute(sql, params).rowcount, durable=durable)

    def _changed(self, label: str, sql: str, params=(), durable: bool = True):
        """Run one write statement; fire True when it changed a row."""
        return self._execute(label, sql, params, durable).addCallback(bool)

    def _query(self, label: str, rows: Rows, sql: str, params=()):
        """Fire with the record of the first row, or None (also for a key no text can hold: L{_unknown})."""
        if _unknown(params):
            return succeed(None)
        return self._call(label, False, lambda db: rows.load(db.execute(sql, params).fetchone()))

    def _query_all(self, label: str, rows: Rows, sql: str, params=()):
        if _unknown(params):
            return succeed([])
        return self._call(label, False, lambda db: [rows.load(row) for row in db.execute(sql, params)])

    def _taken(self, label: str, rows: Rows, sql: str, params):
        """Run one write statement that returns what it removes (C{RETURNING *}); fire with its first record or None."""
        return self._call(label, True, lambda db: rows.load(_first(db.execute(sql, params))))

    def _insert(self, label: str, rows: Rows, value, durable: bool = True):
        return self._execute(label, rows.insert, rows.params(value), durable).addCallback(lambda _: None)

    def _put(self, label: str, rows: Rows, value):
        return self._execute(label, rows.put, rows.params(value)).addCallback(lambda _: None)

    # IServerSecrets

    def server_key(self, name):
        return self._call("server_key", True, _server_key, name)

    # IClientRegistry

    def add_client(self, client):
        return self._insert("add_client", _T.clients, client)

    def put_client(self, client):
        return self._put("put_client", _T.clients, client)

    def change_client(self, before, after):
        return self._call("change_client", True, _change_client, before, after)

    def get_client(self, client_id):
        return self._query("get_client", _T.clients, "SELECT * FROM clients WHERE client_id = ?", (client_id,))

    def list_clients(self, after=None, limit=None):
        return self._query_all("list_clients", _T.clients, "SELECT * FROM clients WHERE client_id > ?"
                               " ORDER BY client_id LIMIT ?", (after or "", -1 if limit is None else limit))

    def list_clients_of(self, sources):
        sql = f"SELECT * FROM clients WHERE source IN ({', '.join('?' * len(sources))}) ORDER BY client_id"
        return self._query_all("list_clients_of", _T.clients, sql, tuple(sources))

    def count_clients(self, source):
        sql = "SELECT count(*) FROM clients WHERE source = ?"
        return self._call("count_clients", False, lambda db: db.execute(sql, (source,)).fetchone()[0])

    def remove_client(self, client_id, expected=None):
        return self._call("remove_client", True, _remove_client, client_id, expected)

    # IBrowserSessionStore

    def create_session(self, session):
        return self._insert("create_session", _T.sessions, session, durable=False)

    def get_session(self, session_hash, now):
        return self._query("get_session",
            _T.sessions,
            "SELECT * FROM browser_sessions WHERE session_hash = ? AND expires_at > ?",
            (session_hash, now),
        )

    def end_session(self, session_hash):
        return self._taken("end_session",
            _T.sessions, "DELETE FROM browser_sessions WHERE session_hash = ? RETURNING *", (session_hash,)
        )

    def end_user_sessions(self, sub):
        return self._call("end_user_sessions", True,
            lambda db: [_T.sessions.load(row) for row in
                        db.execute("DELETE FROM browser_sessions WHERE sub = ? RETURNING *", (sub,))]
        )

    def list_user_sessions(self, sub, now, after=None, limit=None):
        at, sid = after or BEFORE_EVERY_ROW
        return self._query_all("list_user_sessions", _T.sessions,
            "SELECT * FROM browser_sessions WHERE sub = ? AND expires_at > ?"
            " AND (created_at, sid) > (?, ?) ORDER BY created_at, sid LIMIT ?",
            (sub, now, at, sid, -1 if limit is None else limit),
        )

    def touch_session(self, session_hash, now):
        return self._execute("touch_session",
            "UPDATE browser_sessions SET last_seen = ? WHERE session_hash = ?", (now, session_hash), durable=False
        ).addCallback(lambda _: None)

    # IInteractionStore

    def save_interaction(self, interaction):
        return self._insert("save_interaction", _T.interactions, interaction, durable=False)

    def save_login_interaction(self, interaction, cap):
        return self._call("save_login_interaction", True, _save_login_interaction, interaction, cap, durable=False)

    def get_interaction(self, interaction_id, now):
        return self._query("get_interaction",
            _T.interactions,
            "SELECT * FROM interactions WHERE interaction_id = ? AND expires_at > ?",
            (interaction_id, now),
        )

    def take_interaction(self, interaction_id, stage):
        return self._changed("take_interaction",
            "DELETE FROM interactions WHERE interaction_id = ? AND stage = ?", (interaction_id, stage), durable=False
        )

    # ILinkAttemptStore

    def save_link_attempt(self, attempt):
        return self._insert("save_link_attempt", _T.link_attempts, attempt, durable=False)

    def take_link_attempt(self, state_hash, session_hash, now):
        return self._taken("take_link_attempt",
            _T.link_attempts,
            "DELETE FROM link_attempts WHERE state_hash = ? AND session_hash = ? AND expires_at > ? RETURNING *",
            (state_hash, session_hash, now),
        )

    # IPushedRequestStore

    def save_pushed_request(self, pushed):
        return self._insert("save_pushed_request", _T.pushed, pushed, durable=False)

    def take_pushed_request(self, uri_hash, client_id, now):
        return self._taken("take_pushed_request",
            _T.pushed,
            "DELETE FROM pushed_requests WHERE uri_hash = ? AND client_id = ? AND expires_at > ? RETURNING *",
            (uri_hash, client_id, now),
        )

    # IAuthorizationCodeStore

    def save_code(self, code, grant, stored_client=True):
        def save(db):
            if not db.execute(_CLIENT_GRANT if stored_client else _T.grants.insert, _T.grants.params(grant)).rowcount:
                return False
            db.execute(_T.codes.insert, _T.codes.params(code))
            return True

        return self._call("save_code", True, save, durable=False)

    def find_code(self, code_hash, now, link_provider=None):
        sql, params = _CODES.find.pick(link_provider, {"hash": code_hash})
        return self._call("find_code", False, lambda db: codes.found_in(_T, db.execute(sql, params).fetchone(), now))

    def redeem_code(self, code_hash, access, refresh, now):
        return self._call("redeem_code", True, _redeem_code, code_hash, access, refresh, now)

    def refuse_code(self, code_hash, now):
        return self._call("refuse_code", True, _refuse_code, code_hash, now)

    # IDeviceAuthorizationStore

    def save_device_authorization(self, device):
        return self._insert("save_device_authorization", _T.devices, device, durable=False)

    def find_device_authorization(self, user_code_hash, now):
        return self._query("find_device_authorization", _T.devices, _DEVICE.find,
                           {"user_code_hash": user_code_hash, "now": now})

    def decide_device_authorization(self, user_code_hash, sub, grant, now):
        return self._call("decide_device_authorization", True, _decide_device, user_code_hash, sub, grant, now)

    def redeem_device_authorization(self, device_code_hash, access, refresh, now):
        return self._call("redeem_device_authorization", True, _redeem_device, device_code_hash, access, refresh,
                          now)

    def poll_device_authorization(self, device_code_hash, client_id, slow_down, now):
        return self._call("poll_device_authorization", True, _poll_device, device_code_hash, client_id,
                          slow_down, now, durable=False)

    # IGrantStore

    def get_grant(self, grant_id):
        return self._query("get_grant", _T.grants, "SELECT * FROM grants WHERE grant_id = ?", (grant_id,))

    def issue_tokens(self, access, refresh):
        return self._call("issue_tokens", True, _issue_tokens, access, refresh)

    def start_grant(self, grant, access):
        def start(db):
            if not db.execute(_CLIENT_GRANT, _T.grants.params(grant)).rowcount:
                return False
            db.execute(_T.access.insert, _T.access.params(access))
            return True

        return self._call("start_grant", True, start)

    # IClientAssertionStore

    def claim_jti(self, client_id, jti, expires_at, now):
        return self._changed("claim_jti",
            "INSERT INTO client_assertions (client_id, jti, expires_at) VALUES (?, ?, ?)"
            " ON CONFLICT (client_id, jti) DO UPDATE SET expires_at = excluded.expires_at"
            " WHERE client_assertions.expires_at <= ?",
            (client_id, jti, expires_at, now),
        )

    def find_access_token(self, token_hash, now, link_provider=None):
        return self._query("find_access_token", _T.access,
                           *_TOKENS.access.pick(link_provider, {"hash": token_hash, "now": now}))

    def get_refresh_token(self, token_hash, link_provider=None):
        return self._query("get_refresh_token", _T.refresh, *_TOKENS.refresh.pick(link_provider, {"hash": token_hash}))

    def rotate_refresh(self, old_hash, new_refresh, new_access, replay, grace_until, now):
        return self._call(
            "rotate_refresh", True, _rotate_refresh, old_hash, new_refresh, new_access, replay, grace_until, now
        )

    def revoke_token(self, token_hash, client_id, now):
        return self._call("revoke_token", True, _revoke_token, token_hash, client_id, now)

    def revoke_grant(self, grant_id, now):
        return self._changed("revoke_grant", _REVOKE_GRANT, (now, grant_id))

    def revoke_user_grants(self, sub, now):
        return self._execute(
            "revoke_user_grants", "UPDATE grants SET revoked_at = ? WHERE sub = ? AND revoked_at IS NULL", (now, sub)
        )

    def list_user_grants(self, sub, now, after=None, limit=None):
        at, grant_id = after or BEFORE_EVERY_ROW
        return self._query_all("list_user_grants", _T.grants,
            "SELECT * FROM grants WHERE sub = ? AND revoked_at IS NULL AND expires_at > ?"
            " AND (created_at, grant_id) > (?, ?) ORDER BY created_at, grant_id LIMIT ?",
            (sub, now, at, grant_id, -1 if limit is None else limit),
        )

    def access_state(self, sub, now):
        if _unknown((sub,)):
            return succeed(AccessState(ban=None, has_active_grant=False))

        def state(db):
            row = db.execute(_ACCESS_STATE, {"sub": sub, "now": now}).fetchone()
            return AccessState(ban=ban_of(row, sub), has_active_grant=bool(row["has_grant"]))

        return self._call("access_state", False, state)

    def session_clients(self, sid):
        return self._call("session_clients", False,
            lambda db: [
                row["client_id"]
                for row in db.execute(
                    "SELECT DISTINCT client_id FROM grants WHERE sid = ? ORDER BY client_id", (sid,)
                )
            ]
        )

    def save_consent(self, sub, client_id, scope, now, stored_client=True):
        def merge(db):
            stored = db.execute("SELECT 1 FROM clients WHERE client_id = ?", (client_id,)).fetchone()
            if stored_client and stored is None:
                return None
            row = db.execute("SELECT scope FROM consents WHERE sub = ? AND client_id = ?", (sub, client_id)).fetchone()
            merged = frozenset(scope) | (frozenset(row["scope"].split()) if row is not None else frozenset())
            db.execute("INSERT OR REPLACE INTO consents (sub, client_id, scope, created_at) VALUES (?, ?, ?, ?)",
                       (sub, client_id, scope_text(merged), now))
            return merged

        # One write transaction (BEGIN IMMEDIATE): no revoke lands between the read and the write.
        return self._call("save_consent", True, merge)

    def get_consent(self, sub, client_id):
        def get(db):
            row = db.execute("SELECT scope FROM consents WHERE sub = ? AND client_id = ?", (sub, client_id)).fetchone()
            return None if row is None else frozenset(row["scope"].split())

        return self._call("get_consent", False, get)

    def revoke_consent(self, sub, client_id):
        return self._changed("revoke_consent", "DELETE FROM consents WHERE sub = ? AND client_id = ?", (sub, client_id))

    def list_user_consents(self, sub):
        return self._call("list_user_consents", False,
            lambda db: [
                Consent(sub, row["client_id"], row["scope"].split(), row["created_at"])
                for row in db.execute(
                    "SELECT client_id, scope, created_at FROM consents WHERE sub = ? ORDER BY client_id", (sub,)
                )
            ]
        )

    # IBanStore

    def ban_user(self, ban):
        return self._put("ban_user", _T.bans, ban)

    def unban_user(self, sub):
        return self._changed("unban_user", "DELETE FROM bans WHERE sub = ?", (sub,))

    def get_ban(self, sub, now):
        return self._query("get_ban",
            _T.bans, "SELECT * FROM bans WHERE sub = ? AND (until IS NULL OR until > ?)", (sub, now)
        )

    def list_bans(self, now, after=None, limit=None):
        return self._query_all("list_bans",
            _T.bans, "SELECT * FROM bans WHERE sub > ? AND (until IS NULL OR until > ?) ORDER BY sub LIMIT ?",
            (after or "", now, -1 if limit is None else limit),
        )

    # IImportStore

    def import_batch(self, batch):
        def write(db):
            return {
                kind: sum(db.execute(sql, params(record)).rowcount for record in getattr(batch, kind))
                for kind, (sql, params) in _IMPORT.items()
            }

        return self._call("import_batch", True, write)

    # ILinkedAccountStore

    def link_account(self, account, displacing=None):
        # Checked in the writer's transaction, before the user's earlier link goes;
        # the unique index on the provider account (schema 023) backs the check.
        def link(db):
            if displacing is not None:
                db.execute(_DISPLACE, displaced(account, displacing))
            if _first(db.execute(_LINKED_ELSEWHERE, (account.provider, account.provider_user_id, account.sub))):
                raise AlreadyLinked.of(account.provider, account.provider_user_id)
            replaced = _T.linked.load(_first(db.execute(
                "DELETE FROM linked_accounts WHERE sub = ? AND provider = ? RETURNING *", (account.sub, account.provider)
            )))
            db.execute(_T.linked.insert, _T.linked.params(account))
            return replaced

        return self._call("link_account", True, link)

    def get_linked_account(self, sub, provider):
        return self._query("get_linked_account",
            _T.linked, "SELECT * FROM linked_accounts WHERE sub = ? AND provider = ?", (sub, provider)
        )

    def linked_sub(self, provider, provider_user_id):
        if _unknown((provider, provider_user_id)):
            return succeed(None)
        return self._call("linked_sub", False, lambda db: _first(db.execute(
            "SELECT sub FROM linked_accounts WHERE provider = ? AND provider_user_id = ?", (provider, provider_user_id)
        ))).addCallback(lambda row: None if row is None else row[0])

    def unlink_account(self, sub, provider):
        return self._taken("unlink_account",
            _T.linked, "DELETE FROM linked_accounts WHERE sub = ? AND provider = ? RETURNING *", (sub, provider)
        )

    def update_linked_tokens(
        self, account_id, expected_version, access_token_enc, refresh_token_enc, scope, expires_at, now,
    ):
        return self._call("update_linked_tokens", True,
            lambda db: _T.linked.load(
                _first(
                    db.execute(
                        "UPDATE linked_accounts SET access_token_enc = ?,"
                        " refresh_token_enc = COALESCE(?, refresh_token_enc),"
                        " scope = ?, expires_at = ?, updated_at = ?, version = version + 1"
                        " WHERE account_id = ? AND version = ? RETURNING *",
                        (access_token_enc, refresh_token_enc, scope, expires_at, now, account_id, expected_version),
                    )
                )
            )
        )

    def acquire_link_lock(self, account_id, holder, now, ttl):
        # Taken when there is no lease, it has run out, or the holder renews it.
        return self._call("acquire_link_lock", True,
            lambda db: _first(
                db.execute(
                    "INSERT INTO link_locks (account_id, holder, until) VALUES (?, ?, ?)"
                    " ON CONFLICT (account_id) DO UPDATE SET holder = excluded.holder, until = excluded.until"
                    " WHERE link_locks.until <= ? OR link_locks.holder = excluded.holder"
                    " RETURNING holder",
                    (account_id, holder, now + ttl, now),
                )
            )
            is not None
        )

    def release_link_lock(self, account_id, holder):
        return self._execute("release_link_lock",
            "DELETE FROM link_locks WHERE account_id = ? AND holder = ?", (account_id, holder)
        ).addCallback(lambda _: None)

    # ILoginThrottle

    def attempt(self, account, address, device_hash, policy, now):
        return self._call("throttle_attempt", True, _attempt, account, address, device_hash, policy, now,
                          durable=False)

    def forgive(self, ticket):
        return self._changed("throttle_forgive", "DELETE FROM login_attempts WHERE attempt_id = ?", (ticket,),
                             durable=False)

    def succeeded(self, account, address, now):
        return self._execute("throttle_succeeded",
            "DELETE FROM login_attempts WHERE account = ? AND address = ?", (account, address), durable=False
        ).addCallback(lambda _: None)

    # IKnownDeviceStore

    def remember_device(self, account, device_hash, expires_at):
        return self._execute("remember_device",
            _THROTTLE.remember, {"account": account, "device_hash": device_hash, "expires_at": expires_at},
            durable=False,
        ).addCallback(lambda _: None)

    # IProofReplayStore

    def first_use(self, replay_key, expires_at, now):
        return self._changed("first_use",
            "INSERT INTO dpop_proofs (jti_hash, expires_at) VALUES (?, ?)"
            " ON CONFLICT (jti_hash) DO UPDATE SET expires_at = excluded.expires_at"
            " WHERE dpop_proofs.expires_at <= ?",
            (replay_key, expires_at, now),
        )

    # IFactorStore

    def enrol_totp(self, sub, secret_enc, step, now):
        return self._put("enrol_totp", _T.totp, TotpFactor(sub, secret_enc, now, step))

    def get_totp(self, sub):
        return self._query("get_totp", _T.totp, "SELECT * FROM totp_factors WHERE sub = ?", (sub,))

    def use_totp_step(self, sub, step):
        return self._changed("use_totp_step",
            "UPDATE totp_factors SET last_step = ? WHERE sub = ? AND last_step < ?", (step, sub, step)
        )

    def replace_recovery_codes(self, sub, code_hashes, now):
        def replace(db):
            db.execute("DELETE FROM recovery_codes WHERE sub = ?", (sub,))
            db.executemany("INSERT INTO recovery_codes (sub, code_hash, created_at) VALUES (?, ?, ?)",
                           [(sub, code_hash, now) for code_hash in code_hashes])

        return self._call("replace_recovery_codes", True, replace)

    def use_recovery_code(self, sub, code_hash):
        return self._changed("use_recovery_code",
            "DELETE FROM recovery_codes WHERE sub = ? AND code_hash = ?", (sub, code_hash)
        )

    def list_factors(self, sub):
        def factors(db):
            totp = _T.totp.load(db.execute("SELECT * FROM totp_factors WHERE sub = ?", (sub,)).fetchone())
            recovery = db.execute(
                "SELECT count(*) AS remaining, max(created_at) AS created_at FROM recovery_codes WHERE sub = ?",
                (sub,),
            ).fetchone()
            return factors_of(totp, recovery)

        return self._call("list_factors", False, factors)

    def reset_factors(self, sub):
        def reset(db):
            removed = sum(db.execute(f"DELETE FROM {table} WHERE sub = ?", (sub,)).rowcount
                          for table in ("totp_factors", "recovery_codes", "passkeys"))
            db.execute("DELETE FROM mfa_demands WHERE sub = ?", (sub,))
            return removed > 0

        return self._call("reset_factors", True, reset)

    def mfa_demanded(self, sub, now):
        def demanded(db):
            db.execute("INSERT INTO mfa_demands (sub, first_at) VALUES (?, ?) ON CONFLICT (sub) DO NOTHING",
                       (sub, now))
            return db.execute("SELECT first_at FROM mfa_demands WHERE sub = ?", (sub,)).fetchone()["first_at"]

        return self._call("mfa_demanded", True, demanded)

    def add_passkey(self, passkey):
        return self._insert("add_passkey", _T.passkeys, passkey)

    def get_passkey(self, credential_id):
        return self._query("get_passkey", _T.passkeys, "SELECT * FROM passkeys WHERE credential_id = ?",
                           (credential_id,))

    def list_passkeys(self, sub):
        return self._query_all("list_passkeys", _T.passkeys,
            "SELECT * FROM passkeys WHERE sub = ? ORDER BY created_at, credential_id", (sub,)
        )

    def use_passkey(self, credential_id, sign_count, backup_state, now):
        return self._changed("use_passkey",
            "UPDATE passkeys SET sign_count = ?, backup_state = ?, last_used = ? WHERE credential_id = ?"
            " AND (sign_count < ? OR (sign_count = 0 AND ? = 0))",
            (sign_count, int(backup_state), now, credential_id, sign_count, sign_count),
        )

    def remove_passkey(self, sub, credential_id):
        return self._changed("remove_passkey", "DELETE FROM passkeys WHERE sub = ? AND credential_id = ?",
                             (sub, credential_id))

    # IStore

    def ping(self):
        return self._call("ping", False, lambda db: db.execute("SELECT 1").fetchone()).addCallback(lambda _: None)

    def gc(self, now, batch_size):
        return self._own_transactions("gc", _gc, now, batch_size)

    def close(self):
        if self._reader is not self._worker:
            return self._reader.stop().addCallback(lambda _: self._worker.stop())
        return self._worker.stop()


# --- the atomic steps, each run inside one write transaction ----------------


def _change_client(db, before, after):
    """In the writer's transaction: nothing else writes between the read and the write."""
    stored = _T.clients.load(db.execute("SELECT * FROM clients WHERE client_id = ?", (before.client_id,)).fetchone())
    if stored != before:
        return False
    db.execute(_T.clients.put, _T.clients.params(after))
    return True


def _remove_client(db, client_id, expected=None):
    """Codes and tokens go with the grants (ON DELETE CASCADE); in the writer's transaction, as L{_change_client}."""
    if expected is not None and _T.clients.load(
        db.execute("SELECT * FROM clients WHERE client_id = ?", (client_id,)).fetchone()
    ) != expected:
        return False
    db.execute("DELETE FROM grants WHERE client_id = ?", (client_id,))
    db.execute("DELETE FROM consents WHERE client_id = ?", (client_id,))
    return db.execute("DELETE FROM clients WHERE client_id = ?", (client_id,)).rowcount > 0


def _redeem_code(db, code_hash, access, refresh, now):
    params = {"hash": code_hash, "now": now}
    if db.execute(_CODES.redeem, params).rowcount:
        _issue_tokens(db, access, refresh)
        return CodeRedeemed()
    used = db.execute(_CODES.used, params).fetchone()
    if used is None:
        return CodeNotFound()
    db.execute(_REVOKE_GRANT, (now, used["grant_id"]))
    return CodeReused(used["grant_id"])


def _refuse_code(db, code_hash, now):
    used = _first(db.execute(_CODES.refuse, {"hash": code_hash, "now": now}))
    if used is not None:
        db.execute(_REVOKE_GRANT, (now, used["grant_id"]))


def _decide_device(db, user_code_hash, sub, grant, now):
    decided = _first(db.execute(_DEVICE.decide, device.decision(user_code_hash, sub, grant, now)))
    if decided is not None and grant is not None:
        db.execute(_T.grants.insert, _T.grants.params(grant))
    return decided is not None


def _poll_device(db, device_code_hash, client_id, slow_down, now):
    row = _T.devices.load(db.execute(_DEVICE.read, {"hash": device_code_hash}).fetchone())
    outcome, changed = device.poll(row, client_id, slow_down, now)
    if changed is not None:
        db.execute(_DEVICE.write, device.written(changed))
    return outcome


def _redeem_device(db, device_code_hash, access, refresh, now):
    params = device.redeeming(device_code_hash, now)
    if _first(db.execute(_DEVICE.redeem, params)) is not None:
        _issue_tokens(db, access, refresh)
        return POLL_REDEEMED
    used = db.execute(_DEVICE.redeemed, params).fetchone()
    if used is None:
        return POLL_UNKNOWN
    db.execute(_REVOKE_GRANT, (now, used["grant_id"]))
    return POLL_REUSED


def _server_key(db, name):
    db.execute("INSERT INTO server_keys (name, key) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
               (name, secrets.token_bytes(SERVER_KEY_BYTES)))
    return bytes(db.execute("SELECT key FROM server_keys WHERE name = ?", (name,)).fetchone()["key"])


def _issue_tokens(db, access, refresh):
    db.execute(_T.access.insert, _T.access.params(access))
    if refresh is not None:
        db.execute(_T.refresh.insert, _T.refresh.params(refresh))


_ROTATE = (
    "UPDATE refresh_tokens SET consumed_at = :now, grace_until = :grace_until, replay = :replay"
    " WHERE token_hash = :old_hash AND consumed_at IS NULL AND expires_at > :now"
    f" AND {issuable(SQLITE, 'refresh_tokens.grant_id')} RETURNING grant_id"
)


_NOT_ROTATED = (
    "SELECT r.grant_id, r.expires_at, r.consumed_at, r.grace_until, r.replay, g.revoked_at,"
    f" {banned(SQLITE, 'g.sub')} AS banned"
    " FROM refresh_tokens r JOIN grants g ON g.grant_id = r.grant_id WHERE r.token_hash = :old_hash"
)


def _rotate_refresh(db, old_hash, new_refresh, new_access, replay, grace_until, now):
    rotated = _first(
        db.execute(_ROTATE, {"now": now, "grace_until": grace_until, "replay": replay, "old_hash": old_hash})
    )
    if rotated is not None:
        _issue_tokens(db, new_access, new_refresh)
        return Rotated()
    old = db.execute(_NOT_ROTATED, {"old_hash": old_hash, "now": now}).fetchone()
    # Unconsumed yet not rotated just now: its user is banned.
    if old is None or old["revoked_at"] is not None or old["expires_at"] <= now or old["consumed_at"] is None:
        return RefreshNotFound()
    # Live, unexpired, consumed before: its lost answer again, unless its user is banned meanwhile.
    if old["replay"] is not None and now < old["grace_until"]:
        return RefreshNotFound() if old["banned"] else Replayed(old["replay"])
    db.execute(_REVOKE_GRANT, (now, old["grant_id"]))
    return Reused(old["grant_id"])


def _attempt(db, account, address, device_hash, policy, now):
    params = throttle.params(account, address, device_hash, policy, now)
    counts = throttle.Counts(**dict(db.execute(_THROTTLE.counts, params).fetchone()))
    wait = throttle.wait(policy, counts, now)
    if wait is not None:
        return ThrottleDecision(wait=wait, ticket=None)
    return ThrottleDecision(wait=None, ticket=_first(db.execute(_THROTTLE.insert, params))["attempt_id"])


def _save_login_interaction(db, interaction, cap):
    """Inside the write transaction, so no other instance can count in between."""
    busy = db.execute(_BUSY_UNTIL, pending.params(interaction, cap)).fetchone()
    if busy is not None:
        return busy["expires_at"]
    db.execute(_T.interactions.insert, _T.interactions.params(interaction))
    return None


def _revoke_token(db, token_hash, client_id, now):
    refresh = db.execute(
        "SELECT grant_id FROM refresh_tokens WHERE token_hash = ? AND client_id = ?", (token_hash, client_id)
    ).fetchone()
    if refresh is not None:
        db.execute(_REVOKE_GRANT, (now, refresh["grant_id"]))
        return RevokedRefresh(refresh["grant_id"])
    access = _first(
        db.execute(
            "UPDATE access_tokens SET revoked_at = COALESCE(revoked_at, ?)"
            " WHERE token_hash = ? AND client_id = ? RETURNING grant_id",
            (now, token_hash, client_id),
        )
    )
    return NotRevoked() if access is None else RevokedAccess(access["grant_id"])


# Each statement takes up to :limit rows of one kind. A grant goes once it is
# revoked or expired and none of its codes could still be redeemed (a
# redemption may still be issuing tokens into it); an expired one also waits
# for its last live token. Its codes and tokens go with it (ON DELETE CASCADE).
# Revoked and expired grants are two statements, so that each uses its index.
_NO_LIVE_CODE = (
    "NOT EXISTS (SELECT 1 FROM authorization_codes c WHERE c.grant_id = old.grant_id AND c.expires_at > :now)"
)
_GC = tuple(
    f"DELETE FROM {table} WHERE ({key}) IN (SELECT {key} FROM {table} AS old WHERE {expired} LIMIT :limit)"
    for table, key, expired in (
        ("authorization_codes", "code_hash", "expires_at <= :now"),
        ("interactions", "interaction_id", "expires_at <= :now"),
        ("device_authorizations", "device_code_hash", "expires_at <= :now"),
        ("link_attempts", "state_hash", "expires_at <= :now"),
        ("pushed_requests", "uri_hash", "expires_at <= :now"),
        ("browser_sessions", "session_hash", "expires_at <= :now"),
        ("access_tokens", "token_hash", "expires_at <= :now"),
        ("refresh_tokens", "token_hash", "expires_at <= :now"),
        ("bans", "sub", "until <= :now"),
        ("link_locks", "account_id", "until <= :now"),
        ("login_attempts", "attempt_id", "expires_at <= :now"),
        ("known_devices", "account, device_hash", "expires_at <= :now"),
        ("client_assertions", "client_id, jti", "expires_at <= :now"),
        ("dpop_proofs", "jti_hash", "expires_at <= :now"),
        ("grants", "grant_id", f"old.revoked_at IS NOT NULL AND {_NO_LIVE_CODE}"),
        (
            "grants",
            "grant_id",
            f"old.expires_at <= :now AND {_NO_LIVE_CODE}"
            " AND NOT EXISTS (SELECT 1 FROM access_tokens a WHERE a.grant_id = old.grant_id"
            "  AND a.revoked_at IS NULL AND a.expires_at > :now)"
            " AND NOT EXISTS (SELECT 1 FROM refresh_tokens r WHERE r.grant_id = old.grant_id"
            "  AND r.consumed_at IS NULL AND r.expires_at > :now)",
        ),
    )
) + (
    "UPDATE refresh_tokens SET replay = NULL WHERE token_hash IN (SELECT token_hash"
    " FROM refresh_tokens AS old WHERE replay IS NOT NULL AND grace_until <= :now LIMIT :limit)",
)


def _gc(db, now, batch_size):
    """One short transaction per kind, so that other writers wait little."""
    count = 0
    for statement in _GC:
        with _transaction(db):
            count += db.execute(statement, {"now": now, "limit": batch_size}).rowcount
    return count
