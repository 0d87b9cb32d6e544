"""
The production store: PostgreSQL, shared by any number of server instances.

Nothing that matters lives in one process: sessions, interactions, codes,
grants, the grace-window replay of a rotated refresh token and the chat-link
refresh lease are rows, so any instance can serve any step of a user's flow.

Every racing step is one statement that decides it (C{UPDATE ... WHERE ...
RETURNING}, an upsert with a condition, or a data-modifying C{WITH}), run in
autocommit at PostgreSQL's default READ COMMITTED: a statement that waited
for another's row lock re-checks its condition on the committed row, so
exactly one of two racing instances wins and the other sees what the winner
did. SERIALIZABLE would instead fail one of them and need a retry loop.

Queries run on txpostgres connections (asynchronous psycopg2, no threads),
opened on demand up to C{pool_size}. An outage never hangs a request: a
connection is waited for at most C{connect_timeout}, a statement runs at
most C{statement_timeout} (the server cancels it; a client-side deadline a
second later closes a connection whose server went silent), and every such
failure is L{StoreUnavailable}, which the web layer answers with 503. Broken
connections are dropped and new ones opened by later requests, so the
server recovers by itself when the database is back. The pool and the
connection keys are L{authsrv.pg}'s, shared with the other PostgreSQL
plugins, the migration runner and the row mapping are shared with the SQLite
store; this module maps their failures to the store's errors.

The steps of a flow in progress (an interaction saved or used up, a code
saved, a browser session opened or touched, the sign-in throttle's counts,
a known device, a pushed request, a link attempt, a device authorization
and each of its device's polls) commit without waiting for the write-ahead
log's flush (L{STEP}): every instance sees them at once, and only a crash
of the database loses them, with every commit after them, which takes the
person back to the start of that sign-in. Tokens, their redemption,
rotation and revocation, bans, consents, clients and keys wait for it, and
their commit flushes the steps before them too.
"""

from __future__ import annotations

import secrets
import socket
from contextlib import closing
from functools import partial
from time import perf_counter

import psycopg2
import psycopg2.errorcodes
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ConnectionDone, ConnectionLost
from zope.interface import implementer

from authsrv.configsection import ConfigError, Unreachable
from authsrv.hostlookup import LookupsBusy
from authsrv.interfaces import SERVER_KEY_BYTES, IStore
from authsrv.migrations import Ledger, MigrationError, PostgresMigration, migrate as run_migrations, schema_steps
from authsrv.pg.gather import Gather
from authsrv.pg.pool import (
    ConnectFailed,
    NoFreeConnection,
    Pool,
    PoolClosed,
    Prepared,
    ServerCancelled,
    TimedOut,
    fetch,
    first,
    first_line,
    host_lookups,
    rowcount,
)
from authsrv.pg.settings import ConnectionSettings, read_settings
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
    BEFORE_EVERY_ROW, POSTGRES, Lookup, Rows, access_lookup, access_state_sql, ban_of, banned, client_exists, client_grant,
    displace_link, displaced, factors_of, import_statements, issuable, refresh_lookup, scope_text, tables,
    token_lookups, unencodable,
)

COMPONENT = "store"
"""This schema's name in C{schema_version}, which other components may share."""

MIGRATION_LOCK = 0x6175_7468_7372_7601
"""
The advisory lock key every instance takes while it migrates, so that two
instances starting at once never both migrate.
"""

LEDGER = Ledger("schema_version", COMPONENT, COMPONENT)

ACCOUNT_LOCKS, ADDRESS_LOCKS = 0x6174_6831, 0x6174_6832
"""
The classes of the advisory locks a login attempt takes, keyed by the hash
of its account and of its address: attempts that could change each other's
counts are decided one at a time, across instances.
"""

PENDING_LOCKS = 0x6174_6833
"""
The class of the advisory lock a new login-stage interaction takes, keyed by
the hash of its client address, so the address's cap is never passed.
"""


# --- configuration -----------------------------------------------------------


def from_config(section, context) -> "PostgresStore | None":
    """
    Check the section, then connect and migrate the schema now, at start-up,
    so that an unreachable database or a too-new schema stops the server with
    one line naming the DSN's key (never the DSN: it may hold a password).
    """
    settings = read_settings(section, "authsrv")
    pool_size = section.int("pool_size", 8, minimum=1)
    section.done()
    if context.check_only:
        return None
    try:
        migrate(settings.dsn, settings.connect_timeout, int(context.reactor.seconds()))
    except psycopg2.OperationalError as e:
        raise Unreachable(settings.key, f"cannot use the database: {first_line(e)}") from None
    except (psycopg2.Error, MigrationError) as e:
        raise ConfigError(settings.key, f"cannot use the database: {first_line(e)}") from None
    return PostgresStore(
        context.reactor, settings.dsn, pool_size=pool_size, statement_timeout=settings.statement_timeout,
        connect_timeout=settings.connect_timeout,
        lookups=host_lookups(context, pool_size), observer=context.store_observer,
    )


# --- schema -------------------------------------------------------------------


def migrations() -> list[tuple[int, str, str]]:
    """(version, file name, SQL) of every shipped schema step, in order."""
    return schema_steps("authsrv.store", "postgres")


def migrate(dsn: str, connect_timeout: int, now: int, steps=None) -> int:
    """
    Bring the schema to the newest of C{steps} (the shipped ones by
    default), see L{authsrv.migrations.migrate}. Returns the version now in force.
    """
    # A statement timeout of 0 is none: steps may take long, and the runner bounds its lock wait.
    settings = ConnectionSettings(dsn, "dsn", connect_timeout, 0, "authsrv")
    with closing(settings.connect()) as connection:
        return run_migrations(
            connection, PostgresMigration(MIGRATION_LOCK), migrations() if steps is None else steps, LEDGER, now
        )


# --- errors -------------------------------------------------------------------


_UNAVAILABLE_CLASSES = ("08", "25", "40", "53", "57", "58")
"""
SQLSTATE classes that say "not now" rather than "wrong": connection
exceptions, read-only transaction (a standby after failover), rollbacks
(deadlock), insufficient resources, operator intervention (shutdown), system
errors.
"""


_PROVIDER_ACCOUNT_INDEX = "linked_accounts_provider_account"
"""One provider account, one user (schema 021): its violation is L{AlreadyLinked}."""


def _store_error(error: BaseException) -> BaseException:
    """The store's own exception for a pool or driver one, or C{error} itself."""
    if isinstance(error, ConnectFailed):
        return _store_error(error.cause)
    if isinstance(error, NoFreeConnection):
        return StoreUnavailable(f"no PostgreSQL connection became free within {error.seconds}s")
    if isinstance(error, TimedOut):
        return StoreUnavailable(f"PostgreSQL did not answer within {error.seconds}s")
    if isinstance(error, PoolClosed):
        return StoreUnavailable("the store is closed")
    if isinstance(error, psycopg2.IntegrityError) and error.pgcode == psycopg2.errorcodes.UNIQUE_VIOLATION:
        if error.diag.constraint_name == _PROVIDER_ACCOUNT_INDEX:
            return AlreadyLinked(first_line(error))
        return AlreadyExists(first_line(error))
    if isinstance(error, ServerCancelled):
        return StoreUnavailable("PostgreSQL cancelled the statement (statement_timeout)")
    if isinstance(error, (ConnectionDone, ConnectionLost)):
        return StoreUnavailable("the connection to PostgreSQL was lost")
    if isinstance(error, socket.gaierror):
        return StoreUnavailable(f"cannot look up the PostgreSQL host: {error.strerror}")
    if isinstance(error, LookupsBusy):
        return StoreUnavailable(f"cannot look up the PostgreSQL host: {error}")
    if isinstance(error, (psycopg2.OperationalError, psycopg2.InterfaceError)) or (
        isinstance(error, psycopg2.Error) and (error.pgcode or "")[:2] in _UNAVAILABLE_CLASSES
    ):
        return StoreUnavailable(f"PostgreSQL: {first_line(error)}")
    return error


def _translate(error: BaseException, _label: str) -> tuple[BaseException, bool]:
    """The pool's failure as the store's exception; every unavailability but a closed store is an outage."""
    translated = _store_error(error)
    return translated, isinstance(translated, StoreUnavailable) and not isinstance(error, PoolClosed)


def _unstorable(params: dict) -> bool:
    """
    PostgreSQL text cannot hold U+0000 nor a lone surrogate
    (L{unencodable}), so no stored key does: a lookup by such a key (a user
    id from a JSON body) matches nothing, rather than failing in the driver,
    and in a gathered statement failing the lookups that went with it.
    """
    return any(isinstance(value, str) and "\x00" in value for value in params.values()) or unencodable(params.values())


_T = tables(POSTGRES)
_DISPLACE = displace_link(POSTGRES)


def _prepared(name: str, lookup: Lookup[str]) -> Lookup[Prepared]:
    """Both statements of C{lookup}, each prepared when a connection first runs it."""
    return Lookup(Prepared(name, lookup.plain), Prepared(name + "_linked", lookup.linked))


# The lookups of every introspection, UserInfo, refresh and user-access request, prepared once per connection
# (the code exchange's and the rotation's statements are prepared below and beside their steps).
_TOKENS = token_lookups(_T, POSTGRES)
_FIND_ACCESS_TOKEN = _prepared("authsrv_find_access_token", _TOKENS.access)
_GET_REFRESH_TOKEN = _prepared("authsrv_get_refresh_token", _TOKENS.refresh)
_ACCESS_STATE = Prepared("authsrv_access_state", access_state_sql(POSTGRES))
# The same, over the keys of lookups that waited together (L{authsrv.pg.gather}).
_FIND_ACCESS_TOKENS = _prepared("authsrv_find_access_tokens", access_lookup(POSTGRES, "= ANY(%(hashes)s)"))
_GET_REFRESH_TOKENS = _prepared("authsrv_get_refresh_tokens", refresh_lookup(_T, POSTGRES, "= ANY(%(hashes)s)"))
_ACCESS_STATES = Prepared(
    "authsrv_access_states", access_state_sql(POSTGRES, users="unnest(%(subs)s::text[]) AS u(sub)", sub="u.sub"))
_IMPORT = import_statements(_T, POSTGRES)
_THROTTLE = throttle.statements(POSTGRES)
_DEVICE = device.statements(POSTGRES, lock=" FOR UPDATE")
_CODES = codes.statements(_T, POSTGRES)
_FIND_CODE = _prepared("authsrv_find_code", _CODES.find)
_FIND_CODES = _prepared("authsrv_find_codes", codes.find_lookup(_T, POSTGRES, "= ANY(%(hashes)s)"))


def _new_grant(stored_client: bool) -> str:
    """
    A new grant, stored only while its client is (the insert locks the
    client's row), or, for a client described by its metadata document,
    which is never stored, stored at once; what it starts with follows.
    """
    insert = client_grant(_T, POSTGRES, "g_") if stored_client else _T.grants.insert_as("g_")
    return f"WITH new_grant AS ({insert} RETURNING grant_id) "


STEP = "SET LOCAL synchronous_commit TO off; "
"""
Put before a flow step's statement, sent in the same query: the statements
of one query are one transaction, which then commits without waiting for
the flush (PostgreSQL's asynchronous commit, for that transaction alone).
"""

# A grant with its code or its one token, prepared: its check of the client costs nothing once planned.
_SAVE_CODE = {
    stored: Prepared(f"authsrv_save_code{'' if stored else '_unlisted'}",
                     _new_grant(stored) + _T.codes.insert_as("c_", "new_grant"), before=STEP)
    for stored in (True, False)
}
_START_GRANT = Prepared("authsrv_start_grant", _new_grant(True) + _T.access.insert_as("a_", "new_grant"))

# Statements sent as one query, which PostgreSQL runs as one implicit
# transaction: the address's lock is held from the lock's statement until the
# last, with its own later snapshot, has counted and inserted (one round trip).
_SAVE_LOGIN_INTERACTION = (
    STEP + "SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(address)s));"
    f" WITH busy AS ({pending.busy_until(POSTGRES)}),"
    f" saved AS ({_T.interactions.insert_as('', '(SELECT 1) AS free WHERE NOT EXISTS (SELECT 1 FROM busy)')})"
    " SELECT (SELECT expires_at FROM busy) AS busy_until"
)


def _text(value: str) -> str:
    """
    A login name as PostgreSQL text, which cannot hold U+0000: throttled under
    U+FFFD in its place (a name no one signs in with either way).
    """
    return value.replace("\x00", "\ufffd")


# --- the store ------------------------------------------------------------------


@implementer(IStore)
class PostgresStore:
    """L{IStore} on a L{Pool} of connections to one PostgreSQL database."""

    def __init__(
        self, reactor, dsn: str, *, pool_size: int, statement_timeout: int, connect_timeout: int, lookups,
        observer: Observer | None = None,
    ):
        """
        C{lookups} looks host names up (L{host_lookups}); C{observer}, if
        any, hears of every call (see L{authsrv.store.observer}).
        """
        settings = ConnectionSettings(dsn, "dsn", connect_timeout, statement_timeout, "authsrv")
        self._pool = Pool(
            reactor, settings, size=pool_size, lookups=lookups, translate=_translate, what="PostgreSQL",
            consequence="requests that need the store are answered 503",
        )
        self._observer = observer
        self._reactor = reactor
        self._access_tokens = self._gather("find_access_token", _find_access_token, _find_access_tokens)
        self._access_states = self._gather("access_state", _access_state, _access_states)
        self._refresh_tokens = self._gather("get_refresh_token", _get_refresh_token, _get_refresh_tokens)
        self._codes = self._gather("find_code", _find_code, _find_codes)

    def _gather(self, label: str, one, many) -> Gather:
        """The L{Gather} of one kind of lookup, its statements run and translated as the call C{label}."""
        return Gather(self._reactor, lambda work: self._pool.run(work, label, idempotent=True), one, many)

    def _run(self, label: str, work, *args) -> Deferred:
        """
        Fire with C{await work(connection, *args)} on a pooled connection.
        Every call passes here or through L{_observed}, named by C{label}.
        """
        return self._observed(label, self._pool.run, lambda db: work(db, *args), label)

    def _read(self, label: str, work, *args) -> Deferred:
        """L{_run} for C{work} that only reads, which the pool may run twice (see L{Pool})."""
        return self._observed(label, partial(self._pool.run, idempotent=True), lambda db: work(db, *args), label)

    def _observed(self, label: str, call, *args) -> Deferred:
        """C{call(*args)}, reported to the observer, if any, as the call C{label}."""
        if self._observer is None:
            return call(*args)
        return watched(self._observer, label, perf_counter(), call(*args))

    def _one(self, label: str, rows: Rows | None, sql: str | Prepared, params: dict, read: bool = False) -> Deferred:
        """The record of the first row (the row itself without C{rows}), or None; C{read}: L{_read}."""
        if _unstorable(params):
            return succeed(None)
        run = self._read if read else self._run
        if rows is None:
            return run(label, first, sql, params)
        return run(label, lambda db: first(db, sql, params).addCallback(rows.load))

    def _all(self, label: str, rows: Rows, sql: str, params: dict, read: bool = False) -> Deferred:
        if _unstorable(params):
            return succeed([])

        async def every(db):
            return [rows.load(row) for row in await fetch(db, sql, params)]

        return (self._read if read else self._run)(label, every)

    def _lookup(self, label: str, rows: Rows | None, sql: str, params: dict) -> Deferred:
        """L{_one} for a statement that only reads."""
        return self._one(label, rows, sql, params, read=True)

    def _list(self, label: str, rows: Rows, sql: str, params: dict) -> Deferred:
        """L{_all} for a statement that only reads."""
        return self._all(label, rows, sql, params, read=True)

    def _count(self, label: str, sql: str | Prepared, params: dict) -> Deferred:
        """Run one statement; fire with how many rows it changed."""
        if _unstorable(params):
            return succeed(0)
        return self._run(label, rowcount, sql, params)

    def _changed(self, label: str, sql: str | Prepared, params: dict) -> Deferred:
        """Run one statement; fire True when it changed a row."""
        return self._count(label, sql, params).addCallback(bool)

    def _write(self, label: str, sql: str, params: dict) -> Deferred:
        """Run one statement that stores a record; fire with None."""
        return self._run(label, rowcount, sql, params).addCallback(lambda _: None)

    # IServerSecrets

    def server_key(self, name):
        return self._run("server_key", _server_key, name)

    # IClientRegistry

    def add_client(self, client):
        return self._write("add_client", _T.clients.insert, _T.clients.params(client))

    def put_client(self, client):
        return self._write("put_client", _T.clients.put, _T.clients.params(client))

    def change_client(self, before, after):
        return self._run("change_client", _change_client, before, after)

    def get_client(self, client_id):
        return self._lookup(
            "get_client", _T.clients, "SELECT * FROM clients WHERE client_id = %(id)s", {"id": client_id})

    def list_clients(self, after=None, limit=None):
        return self._list("list_clients", _T.clients, 'SELECT * FROM clients WHERE client_id COLLATE "C" > %(after)s'
                          ' ORDER BY client_id COLLATE "C" LIMIT %(limit)s', {"after": after or "", "limit": limit})

    def list_clients_of(self, sources):
        return self._list("list_clients_of", _T.clients, 'SELECT * FROM clients WHERE source = ANY(%(sources)s)'
                          ' ORDER BY client_id COLLATE "C"', {"sources": list(sources)})

    def count_clients(self, source):
        return self._lookup(
            "count_clients", None, "SELECT count(*) AS clients FROM clients WHERE source = %(source)s",
            {"source": source}).addCallback(lambda row: row["clients"] if row else 0)

    def remove_client(self, client_id, expected=None):
        if expected is not None:
            return self._run("remove_client", _remove_client_if, client_id, expected)
        # Statements of one query, so one transaction, each with its own snapshot: once the client's row is
        # locked, a grant stored beside the removal has been committed (the next statement sees and deletes
        # it) or waits, and then finds no client and stores nothing.
        return self._changed("remove_client",
            "SELECT 1 FROM clients WHERE client_id = %(id)s FOR UPDATE;"
            " DELETE FROM grants WHERE client_id = %(id)s;"
            " DELETE FROM consents WHERE client_id = %(id)s;"
            " DELETE FROM clients WHERE client_id = %(id)s",
            {"id": client_id},
        )

    # IBrowserSessionStore

    def create_session(self, session):
        return self._write("create_session", STEP + _T.sessions.insert, _T.sessions.params(session))

    def get_session(self, session_hash, now):
        return self._lookup("get_session",
            _T.sessions,
            "SELECT * FROM browser_sessions WHERE session_hash = %(hash)s AND expires_at > %(now)s",
            {"hash": session_hash, "now": now},
        )

    def end_session(self, session_hash):
        return self._one("end_session",
            _T.sessions, "DELETE FROM browser_sessions WHERE session_hash = %(hash)s RETURNING *",
            {"hash": session_hash},
        )

    def end_user_sessions(self, sub):
        return self._all("end_user_sessions",
            _T.sessions, "DELETE FROM browser_sessions WHERE sub = %(sub)s RETURNING *", {"sub": sub}
        )

    def list_user_sessions(self, sub, now, after=None, limit=None):
        at, sid = after or BEFORE_EVERY_ROW
        return self._list("list_user_sessions", _T.sessions,
            "SELECT * FROM browser_sessions WHERE sub = %(sub)s AND expires_at > %(now)s"
            ' AND (created_at, sid COLLATE "C") > (%(at)s, %(sid)s)'
            ' ORDER BY created_at, sid COLLATE "C" LIMIT %(limit)s',
            {"sub": sub, "now": now, "at": at, "sid": sid, "limit": limit},
        )

    def touch_session(self, session_hash, now):
        return self._count("touch_session",
            STEP + "UPDATE browser_sessions SET last_seen = %(now)s WHERE session_hash = %(hash)s",
            {"hash": session_hash, "now": now},
        ).addCallback(lambda _: None)

    # IInteractionStore

    def save_interaction(self, interaction):
        return self._write("save_interaction", STEP + _T.interactions.insert, _T.interactions.params(interaction))

    def save_login_interaction(self, interaction, cap):
        params = {**_T.interactions.params(interaction), **pending.params(interaction, cap), "lock_class": PENDING_LOCKS}
        return self._run("save_login_interaction", first, _SAVE_LOGIN_INTERACTION, params).addCallback(
            lambda row: row["busy_until"]
        )

    def get_interaction(self, interaction_id, now):
        return self._lookup("get_interaction",
            _T.interactions,
            "SELECT * FROM interactions WHERE interaction_id = %(id)s AND expires_at > %(now)s",
            {"id": interaction_id, "now": now},
        )

    def take_interaction(self, interaction_id, stage):
        return self._changed("take_interaction",
            STEP + "DELETE FROM interactions WHERE interaction_id = %(id)s AND stage = %(stage)s",
            {"id": interaction_id, "stage": stage},
        )

    # ILinkAttemptStore

    def save_link_attempt(self, attempt):
        return self._write("save_link_attempt", STEP + _T.link_attempts.insert, _T.link_attempts.params(attempt))

    def take_link_attempt(self, state_hash, session_hash, now):
        return self._one("take_link_attempt",
            _T.link_attempts,
            "DELETE FROM link_attempts"
            " WHERE state_hash = %(state)s AND session_hash = %(session)s AND expires_at > %(now)s RETURNING *",
            {"state": state_hash, "session": session_hash, "now": now},
        )

    # IPushedRequestStore

    def save_pushed_request(self, pushed):
        return self._write("save_pushed_request", STEP + _T.pushed.insert, _T.pushed.params(pushed))

    def take_pushed_request(self, uri_hash, client_id, now):
        return self._one("take_pushed_request",
            _T.pushed,
            "DELETE FROM pushed_requests"
            " WHERE uri_hash = %(hash)s AND client_id = %(client_id)s AND expires_at > %(now)s RETURNING *",
            {"hash": uri_hash, "client_id": client_id, "now": now},
        )

    # IAuthorizationCodeStore

    def save_code(self, code, grant, stored_client=True):
        # One statement: the code's foreign key is checked at its end, when the grant exists.
        return self._changed("save_code", _SAVE_CODE[stored_client],
            {**_T.grants.params(grant, "g_"), **_T.codes.params(code, "c_")},
        )

    def find_code(self, code_hash, now, link_provider=None):
        if _unstorable({"hash": code_hash, "provider": link_provider}):
            return succeed(CodeNotFound())
        return self._observed("find_code", self._codes, code_hash, link_provider).addCallback(
            lambda row: codes.found_in(_T, row, now)
        )

    def redeem_code(self, code_hash, access, refresh, now):
        return self._run("redeem_code", _redeem_code, code_hash, access, refresh, now)

    def refuse_code(self, code_hash, now):
        return self._write("refuse_code", _REFUSE_CODE, {"hash": code_hash, "now": now})

    # IDeviceAuthorizationStore

    def save_device_authorization(self, device):
        return self._write("save_device_authorization", STEP + _T.devices.insert, _T.devices.params(device))

    def find_device_authorization(self, user_code_hash, now):
        return self._lookup("find_device_authorization", _T.devices, _DEVICE.find,
                            {"user_code_hash": user_code_hash, "now": now})

    def decide_device_authorization(self, user_code_hash, sub, grant, now):
        params = device.decision(user_code_hash, sub, grant, now)
        if _unstorable(params):
            return succeed(False)
        if grant is None:
            return self._changed("decide_device_authorization", _DEVICE.decide, params)
        # One statement: the grant is stored only by the call that approves.
        return self._changed("decide_device_authorization",
            f"WITH decided AS ({_DEVICE.decide}), new_grant AS ({_T.grants.insert_as('g_', 'decided')})"
            " SELECT device_code_hash FROM decided",
            {**params, **_T.grants.params(grant, "g_")},
        )

    def redeem_device_authorization(self, device_code_hash, access, refresh, now):
        if _unstorable({"hash": device_code_hash}):
            return succeed(POLL_UNKNOWN)
        return self._run("redeem_device_authorization", _redeem_device, device_code_hash, access, refresh, now)

    def poll_device_authorization(self, device_code_hash, client_id, slow_down, now):
        if _unstorable({"hash": device_code_hash, "client_id": client_id}):
            return succeed(device.poll(None, client_id, slow_down, now)[0])
        return self._run("poll_device_authorization", _poll_device, device_code_hash, client_id, slow_down, now)

    # IGrantStore

    def get_grant(self, grant_id):
        return self._lookup("get_grant", _T.grants, "SELECT * FROM grants WHERE grant_id = %(id)s", {"id": grant_id})

    def issue_tokens(self, access, refresh):
        if refresh is None:
            return self._write("issue_tokens", _T.access.insert, _T.access.params(access))
        return self._write("issue_tokens",
            f"WITH new_access AS ({_T.access.insert_as('a_')}) {_T.refresh.insert_as('r_')}",
            {**_T.access.params(access, "a_"), **_T.refresh.params(refresh, "r_")},
        )

    def start_grant(self, grant, access):
        # One statement: the token's foreign key is checked at its end, when the grant exists.
        return self._changed("start_grant", _START_GRANT,
            {**_T.grants.params(grant, "g_"), **_T.access.params(access, "a_")},
        )

    # IClientAssertionStore

    def claim_jti(self, client_id, jti, expires_at, now):
        return self._changed("claim_jti",
            "INSERT INTO client_assertions (client_id, jti, expires_at)"
            " VALUES (%(client_id)s, %(jti)s, %(expires_at)s)"
            " ON CONFLICT (client_id, jti) DO UPDATE SET expires_at = EXCLUDED.expires_at"
            " WHERE client_assertions.expires_at <= %(now)s",
            {"client_id": client_id, "jti": jti, "expires_at": expires_at, "now": now},
        )

    def find_access_token(self, token_hash, now, link_provider=None):
        if _unstorable({"hash": token_hash, "provider": link_provider}):
            return succeed(None)
        return self._observed("find_access_token", self._access_tokens, token_hash, (now, link_provider))

    def get_refresh_token(self, token_hash, link_provider=None):
        if _unstorable({"hash": token_hash, "provider": link_provider}):
            return succeed(None)
        return self._observed("get_refresh_token", self._refresh_tokens, token_hash, link_provider)

    def rotate_refresh(self, old_hash, new_refresh, new_access, replay, grace_until, now):
        return self._run("rotate_refresh", _rotate_refresh, old_hash, new_refresh, new_access, replay, grace_until, now)

    def revoke_token(self, token_hash, client_id, now):
        return self._run("revoke_token", _revoke_token, token_hash, client_id, now)

    def revoke_grant(self, grant_id, now):
        return self._changed("revoke_grant", _REVOKE_GRANT, {"grant_id": grant_id, "now": now})

    def revoke_user_grants(self, sub, now):
        return self._count("revoke_user_grants",
            "UPDATE grants SET revoked_at = %(now)s WHERE sub = %(sub)s AND revoked_at IS NULL",
            {"sub": sub, "now": now},
        )

    def list_user_grants(self, sub, now, after=None, limit=None):
        at, grant_id = after or BEFORE_EVERY_ROW
        return self._list("list_user_grants", _T.grants,
            "SELECT * FROM grants WHERE sub = %(sub)s AND revoked_at IS NULL AND expires_at > %(now)s"
            ' AND (created_at, grant_id COLLATE "C") > (%(at)s, %(id)s)'
            ' ORDER BY created_at, grant_id COLLATE "C" LIMIT %(limit)s',
            {"sub": sub, "now": now, "at": at, "id": grant_id, "limit": limit},
        )

    def access_state(self, sub, now):
        if _unstorable({"sub": sub}):
            return succeed(AccessState(ban=None, has_active_grant=False))
        return self._observed("access_state", self._access_states, sub, now)

    def session_clients(self, sid):
        if _unstorable({"sid": sid}):
            return succeed([])

        async def clients(db):
            rows = await fetch(
                db, 'SELECT DISTINCT client_id COLLATE "C" AS client_id FROM grants WHERE sid = %(sid)s ORDER BY 1',
                {"sid": sid},
            )
            return [row["client_id"] for row in rows]

        return self._run("session_clients", clients)

    def save_consent(self, sub, client_id, scope, now, stored_client=True):
        # The union is taken on the locked row in the upsert itself: a revoke is never undone by an earlier read.
        # The client's row is locked as for a grant (client_exists), so a removal beside it removes it or waits.
        return self._run("save_consent", first,
            "INSERT INTO consents AS c (sub, client_id, scope, created_at)"
            " SELECT %(sub)s, %(client_id)s, %(scope)s, %(now)s"
            + (f" WHERE {client_exists(POSTGRES, '%(client_id)s')}" if stored_client else "") +
            " ON CONFLICT (sub, client_id) DO UPDATE SET created_at = EXCLUDED.created_at, scope = ("
            "SELECT coalesce(string_agg(word, ' ' ORDER BY word COLLATE \"C\"), '') FROM ("
            "SELECT DISTINCT unnest(string_to_array(c.scope || ' ' || EXCLUDED.scope, ' ')) AS word) AS words"
            " WHERE word <> '')"
            " RETURNING scope",
            {"sub": sub, "client_id": client_id, "scope": scope_text(scope), "now": now},
        ).addCallback(lambda row: None if row is None else frozenset(row["scope"].split()))

    def get_consent(self, sub, client_id):
        return self._lookup("get_consent",
            None, "SELECT scope FROM consents WHERE sub = %(sub)s AND client_id = %(client_id)s",
            {"sub": sub, "client_id": client_id},
        ).addCallback(lambda row: None if row is None else frozenset(row["scope"].split()))

    def revoke_consent(self, sub, client_id):
        return self._changed("revoke_consent",
            "DELETE FROM consents WHERE sub = %(sub)s AND client_id = %(client_id)s",
            {"sub": sub, "client_id": client_id},
        )

    def list_user_consents(self, sub):
        if _unstorable({"sub": sub}):
            return succeed([])

        async def consents(db):
            rows = await fetch(
                db, 'SELECT client_id, scope, created_at FROM consents WHERE sub = %(sub)s ORDER BY client_id COLLATE "C"',
                {"sub": sub},
            )
            return [Consent(sub, row["client_id"], row["scope"].split(), row["created_at"]) for row in rows]

        return self._run("list_user_consents", consents)

    # IBanStore

    def ban_user(self, ban):
        return self._write("ban_user", _T.bans.put, _T.bans.params(ban))

    def unban_user(self, sub):
        return self._changed("unban_user", "DELETE FROM bans WHERE sub = %(sub)s", {"sub": sub})

    def get_ban(self, sub, now):
        return self._lookup("get_ban",
            _T.bans, "SELECT * FROM bans WHERE sub = %(sub)s AND (until IS NULL OR until > %(now)s)",
            {"sub": sub, "now": now},
        )

    def list_bans(self, now, after=None, limit=None):
        return self._list("list_bans",
            _T.bans, 'SELECT * FROM bans WHERE sub COLLATE "C" > %(after)s AND (until IS NULL OR until > %(now)s)'
                     ' ORDER BY sub COLLATE "C" LIMIT %(limit)s',
            {"now": now, "after": after or "", "limit": limit},
        )

    # IImportStore

    def import_batch(self, batch):
        return self._run("import_batch", _import_batch, batch)

    # ILinkedAccountStore

    def link_account(self, account, displacing=None):
        return self._run("link_account", _link_account, account, displacing)

    def get_linked_account(self, sub, provider):
        return self._lookup("get_linked_account",
            _T.linked, "SELECT * FROM linked_accounts WHERE sub = %(sub)s AND provider = %(provider)s",
            {"sub": sub, "provider": provider},
        )

    def linked_sub(self, provider, provider_user_id):
        return self._lookup("linked_sub",
            None, "SELECT sub FROM linked_accounts WHERE provider = %(provider)s AND provider_user_id = %(user)s",
            {"provider": provider, "user": provider_user_id},
        ).addCallback(lambda row: None if row is None else row["sub"])

    def unlink_account(self, sub, provider):
        return self._one("unlink_account",
            _T.linked, "DELETE FROM linked_accounts WHERE sub = %(sub)s AND provider = %(provider)s RETURNING *",
            {"sub": sub, "provider": provider},
        )

    def update_linked_tokens(
        self, account_id, expected_version, access_token_enc, refresh_token_enc, scope, expires_at, now,
    ):
        return self._one("update_linked_tokens",
            _T.linked,
            "UPDATE linked_accounts SET access_token_enc = %(access)s,"
            " refresh_token_enc = COALESCE(%(refresh)s, refresh_token_enc),"
            " scope = %(scope)s, expires_at = %(expires_at)s, updated_at = %(now)s, version = version + 1"
            " WHERE account_id = %(id)s AND version = %(version)s RETURNING *",
            {
                "access": access_token_enc, "refresh": refresh_token_enc, "scope": scope,
                "expires_at": expires_at, "now": now, "id": account_id, "version": expected_version,
            },
        )

    def acquire_link_lock(self, account_id, holder, now, ttl):
        # Taken when there is no lease, it has run out, or the holder renews it.
        return self._one("acquire_link_lock",
            None,
            "INSERT INTO link_locks (account_id, holder, until) VALUES (%(id)s, %(holder)s, %(until)s)"
            " ON CONFLICT (account_id) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until"
            " WHERE link_locks.until <= %(now)s OR link_locks.holder = EXCLUDED.holder"
            " RETURNING holder",
            {"id": account_id, "holder": holder, "until": now + ttl, "now": now},
        ).addCallback(lambda row: row is not None)

    def release_link_lock(self, account_id, holder):
        return self._count("release_link_lock",
            "DELETE FROM link_locks WHERE account_id = %(id)s AND holder = %(holder)s",
            {"id": account_id, "holder": holder},
        ).addCallback(lambda _: None)

    # ILoginThrottle

    def attempt(self, account, address, device_hash, policy, now):
        return self._run("throttle_attempt", _attempt, _text(account), _text(address), device_hash, policy, now)

    def forgive(self, ticket):
        return self._changed("throttle_forgive",
            STEP + "DELETE FROM login_attempts WHERE attempt_id = %(ticket)s", {"ticket": ticket}
        )

    def succeeded(self, account, address, now):
        return self._write("throttle_succeeded",
            STEP + "DELETE FROM login_attempts WHERE account = %(account)s AND address = %(address)s",
            {"account": _text(account), "address": _text(address)},
        )

    # IKnownDeviceStore

    def remember_device(self, account, device_hash, expires_at):
        return self._write("remember_device",
            STEP + _THROTTLE.remember, {"account": _text(account), "device_hash": device_hash, "expires_at": expires_at}
        )

    # IProofReplayStore

    def first_use(self, replay_key, expires_at, now):
        return self._changed("first_use",
            "INSERT INTO dpop_proofs (jti_hash, expires_at) VALUES (%(key)s, %(expires_at)s)"
            " ON CONFLICT (jti_hash) DO UPDATE SET expires_at = EXCLUDED.expires_at"
            " WHERE dpop_proofs.expires_at <= %(now)s",
            {"key": replay_key, "expires_at": expires_at, "now": now},
        )

    # IFactorStore

    def enrol_totp(self, sub, secret_enc, step, now):
        return self._write("enrol_totp", _T.totp.put, _T.totp.params(TotpFactor(sub, secret_enc, now, step)))

    def get_totp(self, sub):
        return self._lookup("get_totp", _T.totp, "SELECT * FROM totp_factors WHERE sub = %(sub)s", {"sub": sub})

    def use_totp_step(self, sub, step):
        # A use that waited for a racing one's row lock re-checks last_step on the committed row.
        return self._changed("use_totp_step",
            "UPDATE totp_factors SET last_step = %(step)s WHERE sub = %(sub)s AND last_step < %(step)s",
            {"sub": sub, "step": step},
        )

    def replace_recovery_codes(self, sub, code_hashes, now):
        return self._write("replace_recovery_codes",
            "WITH gone AS (DELETE FROM recovery_codes WHERE sub = %(sub)s)"
            " INSERT INTO recovery_codes (sub, code_hash, created_at)"
            " SELECT %(sub)s, code_hash, %(now)s FROM unnest(%(hashes)s::text[]) AS code_hash",
            {"sub": sub, "hashes": list(code_hashes), "now": now},
        )

    def use_recovery_code(self, sub, code_hash):
        return self._changed("use_recovery_code",
            "DELETE FROM recovery_codes WHERE sub = %(sub)s AND code_hash = %(hash)s", {"sub": sub, "hash": code_hash}
        )

    def list_factors(self, sub):
        return self._run("list_factors", _list_factors, sub)

    def reset_factors(self, sub):
        return self._one("reset_factors",
            None,
            "WITH totp AS (DELETE FROM totp_factors WHERE sub = %(sub)s RETURNING 1),"
            " recovery AS (DELETE FROM recovery_codes WHERE sub = %(sub)s RETURNING 1),"
            " passkey AS (DELETE FROM passkeys WHERE sub = %(sub)s RETURNING 1),"
            " demand AS (DELETE FROM mfa_demands WHERE sub = %(sub)s)"
            " SELECT (SELECT count(*) FROM totp) + (SELECT count(*) FROM recovery)"
            " + (SELECT count(*) FROM passkey) AS removed",
            {"sub": sub},
        ).addCallback(lambda row: bool(row and row["removed"]))

    def mfa_demanded(self, sub, now):
        return self._run("mfa_demanded", _mfa_demanded, sub, now)

    def add_passkey(self, passkey):
        return self._write("add_passkey", _T.passkeys.insert, _T.passkeys.params(passkey))

    def get_passkey(self, credential_id):
        return self._lookup("get_passkey", _T.passkeys, "SELECT * FROM passkeys WHERE credential_id = %(id)s",
                            {"id": credential_id})

    def list_passkeys(self, sub):
        return self._list("list_passkeys", _T.passkeys,
            'SELECT * FROM passkeys WHERE sub = %(sub)s ORDER BY created_at, credential_id COLLATE "C"', {"sub": sub}
        )

    def use_passkey(self, credential_id, sign_count, backup_state, now):
        # A use that waited for a racing one's row lock re-checks the counter on the committed row.
        return self._changed("use_passkey",
            "UPDATE passkeys SET sign_count = %(count)s, backup_state = %(backup)s, last_used = %(now)s"
            " WHERE credential_id = %(id)s AND (sign_count < %(count)s OR (sign_count = 0 AND %(count)s = 0))",
            {"id": credential_id, "count": sign_count, "backup": backup_state, "now": now},
        )

    def remove_passkey(self, sub, credential_id):
        return self._changed("remove_passkey",
            "DELETE FROM passkeys WHERE sub = %(sub)s AND credential_id = %(id)s", {"sub": sub, "id": credential_id}
        )

    # IStore

    def ping(self):
        return self._read("ping", first, "SELECT 1").addCallback(lambda _: None)

    def gc(self, now, batch_size):
        return self._run("gc", _gc, now, batch_size)

    def close(self):
        self._pool.close()
        return succeed(None)


# --- the atomic steps -----------------------------------------------------------

_REVOKE_GRANT = "UPDATE grants SET revoked_at = %(now)s WHERE grant_id = %(grant_id)s AND revoked_at IS NULL"


async def _server_key(db, name):
    # Of two instances inserting at once, the second waits for the first's
    # row and inserts nothing; both then read the first's key.
    await rowcount(db,
        "INSERT INTO server_keys (name, key) VALUES (%(name)s, %(key)s) ON CONFLICT (name) DO NOTHING",
        {"name": name, "key": secrets.token_bytes(SERVER_KEY_BYTES)},
    )
    row = await first(db, "SELECT key FROM server_keys WHERE name = %(name)s", {"name": name})
    return bytes(row["key"])


def _find_access_token(db, token_hash, shared):
    now, link_provider = shared
    return first(db, *_FIND_ACCESS_TOKEN.pick(link_provider, {"hash": token_hash, "now": now})).addCallback(
        _T.access.load)


async def _find_access_tokens(db, hashes, shared):
    now, link_provider = shared
    rows = await fetch(db, *_FIND_ACCESS_TOKENS.pick(link_provider, {"hashes": hashes, "now": now}))
    return {row["token_hash"]: _T.access.load(row) for row in rows}


def _find_code(db, code_hash, link_provider):
    return first(db, *_FIND_CODE.pick(link_provider, {"hash": code_hash}))


async def _find_codes(db, hashes, link_provider):
    return {row["code_hash"]: row for row in await fetch(db, *_FIND_CODES.pick(link_provider, {"hashes": hashes}))}


def _get_refresh_token(db, token_hash, link_provider):
    return first(db, *_GET_REFRESH_TOKEN.pick(link_provider, {"hash": token_hash})).addCallback(_T.refresh.load)


async def _get_refresh_tokens(db, hashes, link_provider):
    rows = await fetch(db, *_GET_REFRESH_TOKENS.pick(link_provider, {"hashes": hashes}))
    return {row["token_hash"]: _T.refresh.load(row) for row in rows}


def _access_state_of(row) -> AccessState:
    return AccessState(ban=ban_of(row, row["sub"]), has_active_grant=row["has_grant"])


def _access_state(db, sub, now):
    return first(db, _ACCESS_STATE, {"sub": sub, "now": now}).addCallback(_access_state_of)


async def _access_states(db, subs, now):
    return {row["sub"]: _access_state_of(row) for row in await fetch(db, _ACCESS_STATES, {"subs": subs, "now": now})}


async def _list_factors(db, sub):
    params = {"sub": sub}
    totp = _T.totp.load(await first(db, "SELECT * FROM totp_factors WHERE sub = %(sub)s", params))
    recovery = await first(db,
        "SELECT count(*) AS remaining, max(created_at) AS created_at FROM recovery_codes WHERE sub = %(sub)s", params
    )
    return factors_of(totp, recovery)


async def _mfa_demanded(db, sub, now):
    # As for server keys: of two racing inserts the second waits and inserts nothing.
    params = {"sub": sub, "now": now}
    await rowcount(db,
        "INSERT INTO mfa_demands (sub, first_at) VALUES (%(sub)s, %(now)s) ON CONFLICT (sub) DO NOTHING", params
    )
    return (await first(db, "SELECT first_at FROM mfa_demands WHERE sub = %(sub)s", params))["first_at"]


def _redeem(name: str, refresh: bool) -> Prepared:
    """The redemption that also stores the access token, and with C{refresh} the refresh token: one statement."""
    stored = f" new_access AS ({_T.access.insert_as('a_', 'redeemed')})"
    if refresh:
        stored += f", new_refresh AS ({_T.refresh.insert_as('r_', 'redeemed')})"
    return Prepared(name, f"WITH redeemed AS ({_CODES.redeem} RETURNING grant_id),{stored} SELECT grant_id FROM redeemed")


_REDEEM = {False: _redeem("authsrv_redeem_code", False), True: _redeem("authsrv_redeem_code_refresh", True)}

# Not redeemed just now: a code used before (a racing redemption won, or a
# replay) revokes its grant in the same statement that finds it used.
_NOT_REDEEMED = (
    f"WITH used AS ({_CODES.used}),"
    " revoked AS (UPDATE grants SET revoked_at = %(now)s WHERE grant_id IN (SELECT grant_id FROM used)"
    "  AND revoked_at IS NULL)"
    " SELECT grant_id FROM used"
)
_REFUSE_CODE = (
    f"WITH used AS ({_CODES.refuse})"
    " UPDATE grants SET revoked_at = %(now)s WHERE grant_id IN (SELECT grant_id FROM used) AND revoked_at IS NULL"
)


async def _redeem_code(db, code_hash, access, refresh, now):
    """
    The winner's redemption and tokens are one statement, so one commit. A
    redemption that waited for a racing one's row lock re-checks used_at on
    the committed row and changes nothing; the next statement, on a
    snapshot that holds the winner's commit, then sees the code used.
    """
    params = {"hash": code_hash, "now": now, **_T.access.params(access, "a_")}
    if refresh is not None:
        params.update(_T.refresh.params(refresh, "r_"))
    if await first(db, _REDEEM[refresh is not None], params) is not None:
        return CodeRedeemed()
    used = await first(db, _NOT_REDEEMED, {"hash": code_hash, "now": now})
    return CodeNotFound() if used is None else CodeReused(used["grant_id"])


def _redeem_device_statement(refresh: bool) -> str:
    """The redemption that also stores the device's tokens: one statement, as L{_redeem}."""
    stored = f" new_access AS ({_T.access.insert_as('a_', 'redeemed')})"
    if refresh:
        stored += f", new_refresh AS ({_T.refresh.insert_as('r_', 'redeemed')})"
    return f"WITH redeemed AS ({_DEVICE.redeem}),{stored} SELECT grant_id FROM redeemed"


_REDEEM_DEVICE = {refresh: _redeem_device_statement(refresh) for refresh in (False, True)}
_DEVICE_NOT_REDEEMED = (
    f"WITH used AS ({_DEVICE.redeemed}),"
    " revoked AS (UPDATE grants SET revoked_at = %(now)s WHERE grant_id IN (SELECT grant_id FROM used)"
    "  AND revoked_at IS NULL)"
    " SELECT grant_id FROM used"
)


async def _redeem_device(db, device_code_hash, access, refresh, now):
    """As L{_redeem_code}: the winner's redemption and tokens are one statement, a loser revokes the grant."""
    params = {**device.redeeming(device_code_hash, now), **_T.access.params(access, "a_")}
    if refresh is not None:
        params.update(_T.refresh.params(refresh, "r_"))
    if await first(db, _REDEEM_DEVICE[refresh is not None], params) is not None:
        return POLL_REDEEMED
    used = await first(db, _DEVICE_NOT_REDEEMED, device.redeeming(device_code_hash, now))
    return POLL_UNKNOWN if used is None else POLL_REUSED


_ROTATE = Prepared("authsrv_rotate_refresh",
    "WITH rotated AS ("
    " UPDATE refresh_tokens SET consumed_at = %(now)s, grace_until = %(grace_until)s, replay = %(replay)s"
    " WHERE token_hash = %(old_hash)s AND consumed_at IS NULL AND expires_at > %(now)s"
    f" AND {issuable(POSTGRES, 'refresh_tokens.grant_id')} RETURNING grant_id),"
    f" new_access AS ({_T.access.insert_as('a_', 'rotated')}),"
    f" new_refresh AS ({_T.refresh.insert_as('r_', 'rotated')})"
    " SELECT grant_id FROM rotated"
)

# Not rotated just now: why not, decided on one snapshot. A token consumed
# before its grace window closed is reuse, and its grant is revoked by the
# same statement.
_NOT_ROTATED = (
    "WITH old AS ("
    " SELECT r.grant_id, r.expires_at, r.consumed_at, r.grace_until, r.replay, g.revoked_at,"
    f" {banned(POSTGRES, 'g.sub')} AS banned"
    " FROM refresh_tokens r JOIN grants g ON g.grant_id = r.grant_id WHERE r.token_hash = %(old_hash)s),"
    " reuse AS ("
    " SELECT grant_id FROM old WHERE revoked_at IS NULL AND expires_at > %(now)s AND consumed_at IS NOT NULL"
    "  AND (replay IS NULL OR grace_until <= %(now)s)),"
    " revoked AS ("
    " UPDATE grants SET revoked_at = %(now)s WHERE grant_id IN (SELECT grant_id FROM reuse)"
    "  AND revoked_at IS NULL)"
    " SELECT old.*, EXISTS (SELECT 1 FROM reuse) AS reused FROM old"
)


async def _rotate_refresh(db, old_hash, new_refresh, new_access, replay, grace_until, now):
    params = {"old_hash": old_hash, "now": now}
    rotated = await first(
        db, _ROTATE,
        {
            **params, "grace_until": grace_until, "replay": replay,
            **_T.access.params(new_access, "a_"), **_T.refresh.params(new_refresh, "r_"),
        },
    )
    if rotated is not None:
        return Rotated()
    old = await first(db, _NOT_ROTATED, params)
    if old is None:
        return RefreshNotFound()
    if old["reused"]:
        return Reused(old["grant_id"])
    if old["revoked_at"] is None and old["expires_at"] > now and old["consumed_at"] is not None and not old["banned"]:
        return Replayed(bytes(old["replay"]))
    return RefreshNotFound()


async def _remove_client_if(db, client_id, expected):
    """
    L{PostgresStore.remove_client} of a client still as C{expected}: one
    transaction holding its row lock, as L{_change_client}, so a change beside
    it lands first (and then nothing is removed) or waits and finds it gone.
    """
    await rowcount(db, "BEGIN")
    row = await first(db, "SELECT * FROM clients WHERE client_id = %(id)s FOR UPDATE", {"id": client_id})
    unchanged = row is not None and _T.clients.load(row) == expected
    if unchanged:
        for table in ("grants", "consents", "clients"):
            await rowcount(db, f"DELETE FROM {table} WHERE client_id = %(id)s", {"id": client_id})
    await rowcount(db, "COMMIT")
    return unchanged


async def _link_account(db, account, displacing):
    """
    One transaction holding the user's link's row lock, so the replaced link
    read is the one the upsert replaces (a token refresh beside it waits, or
    landed first). Replacing it is the upsert's conflict; a provider account
    linked to another user violates _PROVIDER_ACCOUNT_INDEX instead. The
    link C{displacing} names goes first when it is unchanged: of two callers
    displacing it, the second waits for the first's row lock, then deletes
    nothing and meets the first's link in that index.
    """
    await rowcount(db, "BEGIN")
    if displacing is not None:
        await rowcount(db, _DISPLACE, displaced(account, displacing))
    replaced = await first(db, "SELECT * FROM linked_accounts WHERE sub = %(sub)s AND provider = %(provider)s"
                           " FOR UPDATE", {"sub": account.sub, "provider": account.provider})
    await rowcount(db, _T.linked.put, _T.linked.params(account))
    await rowcount(db, "COMMIT")
    return _T.linked.load(replaced)


async def _change_client(db, before, after):
    """One transaction holding the client's row lock: a change or removal beside it waits, then sees this one."""
    await rowcount(db, "BEGIN")
    row = await first(db, "SELECT * FROM clients WHERE client_id = %(id)s FOR UPDATE", {"id": before.client_id})
    unchanged = _T.clients.load(row) == before
    if unchanged:
        await rowcount(db, _T.clients.put, _T.clients.params(after))
    await rowcount(db, "COMMIT")
    return unchanged


async def _poll_device(db, device_code_hash, client_id, slow_down, now):
    """
    One transaction holding the request's row lock, so a racing poll on
    another instance waits and then decides on what this one wrote; a flow's
    step (L{STEP}), in two round trips: a device polls every few seconds.
    """
    row = _T.devices.load(await first(db, "BEGIN; " + STEP + _DEVICE.read, {"hash": device_code_hash}))
    outcome, changed = device.poll(row, client_id, slow_down, now)
    if changed is None:
        await rowcount(db, "COMMIT")
    else:
        await rowcount(db, _DEVICE.write + "; COMMIT", device.written(changed))
    return outcome


_IMPORTED_TABLES = ", ".join((
    _T.clients.table, _T.bans.table, _T.linked.table, "consents", _T.grants.table, _T.refresh.table,
))


async def _import_batch(db, batch):
    """
    Every record in one transaction: a failure rolls back what was written
    before it. Then the tables are analyzed: a running server's prepared
    lookups keep the plans their statistics gave, and planned on tables
    that were near empty they would read every imported row on each
    request until autovacuum came by (docs/migrating-from-better-auth.md).
    """
    await rowcount(db, "BEGIN")
    try:
        counts = {}
        for kind, (sql, params) in _IMPORT.items():
            counts[kind] = 0
            for record in getattr(batch, kind):
                counts[kind] += await rowcount(db, sql, params(record))
    except BaseException:
        await rowcount(db, "ROLLBACK")
        raise
    await rowcount(db, "COMMIT")
    if any(counts.values()):
        await rowcount(db, "ANALYZE " + _IMPORTED_TABLES)
    return counts


async def _attempt(db, account, address, device_hash, policy, now):
    """
    One transaction holding the account's lock, then the address's (always
    in that order, so two attempts never wait for each other in a circle):
    the counts it reads cannot change before it has counted its attempt.
    """
    params = throttle.params(account, address, device_hash, policy, now)
    await rowcount(db, "BEGIN")
    await rowcount(db, STEP + "SELECT pg_advisory_xact_lock(%(class)s, hashtext(%(key)s))",
                   {"class": ACCOUNT_LOCKS, "key": account})
    await rowcount(db, "SELECT pg_advisory_xact_lock(%(class)s, hashtext(%(key)s))",
                   {"class": ADDRESS_LOCKS, "key": address})
    wait = throttle.wait(policy, throttle.Counts(**await first(db, _THROTTLE.counts, params)), now)
    ticket = None if wait is not None else (await first(db, _THROTTLE.insert, params))["attempt_id"]
    await rowcount(db, "COMMIT")
    return ThrottleDecision(wait=wait, ticket=ticket)


_REVOKE_TOKEN = (
    "WITH refresh AS ("
    " SELECT grant_id FROM refresh_tokens WHERE token_hash = %(hash)s AND client_id = %(client_id)s),"
    " family AS ("
    " UPDATE grants SET revoked_at = %(now)s WHERE grant_id IN (SELECT grant_id FROM refresh)"
    "  AND revoked_at IS NULL),"
    " access AS ("
    " UPDATE access_tokens SET revoked_at = COALESCE(revoked_at, %(now)s)"
    " WHERE token_hash = %(hash)s AND client_id = %(client_id)s AND NOT EXISTS (SELECT 1 FROM refresh)"
    " RETURNING grant_id)"
    " SELECT (SELECT grant_id FROM refresh) AS refresh_grant, (SELECT grant_id FROM access) AS access_grant"
)


async def _revoke_token(db, token_hash, client_id, now):
    if _unstorable({"client_id": client_id}):
        return NotRevoked()
    row = await first(db, _REVOKE_TOKEN, {"hash": token_hash, "client_id": client_id, "now": now})
    if row["refresh_grant"] is not None:
        return RevokedRefresh(row["refresh_grant"])
    if row["access_grant"] is not None:
        return RevokedAccess(row["access_grant"])
    return NotRevoked()


# Each statement takes up to %(limit)s rows of one kind, skipping rows another
# instance's housekeeping holds. A grant goes once it is revoked or expired
# and none of its codes could still be redeemed (a redemption may still be
# issuing tokens into it); an expired one also waits for its last live token.
# Its codes and tokens go with it (ON DELETE CASCADE).
_NO_LIVE_CODE = (
    "NOT EXISTS (SELECT 1 FROM authorization_codes c WHERE c.grant_id = old.grant_id AND c.expires_at > %(now)s)"
)
_GC = tuple(
    f"DELETE FROM {table} WHERE ({key}) IN (SELECT {key} FROM {table} AS old WHERE {expired}"
    " LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
    for table, key, expired in (
        ("authorization_codes", "code_hash", "expires_at <= %(now)s"),
        ("interactions", "interaction_id", "expires_at <= %(now)s"),
        ("device_authorizations", "device_code_hash", "expires_at <= %(now)s"),
        ("link_attempts", "state_hash", "expires_at <= %(now)s"),
        ("pushed_requests", "uri_hash", "expires_at <= %(now)s"),
        ("browser_sessions", "session_hash", "expires_at <= %(now)s"),
        ("access_tokens", "token_hash", "expires_at <= %(now)s"),
        ("refresh_tokens", "token_hash", "expires_at <= %(now)s"),
        ("bans", "sub", "until <= %(now)s"),
        ("link_locks", "account_id", "until <= %(now)s"),
        ("login_attempts", "attempt_id", "expires_at <= %(now)s"),
        ("known_devices", "account, device_hash", "expires_at <= %(now)s"),
        ("client_assertions", "client_id, jti", "expires_at <= %(now)s"),
        ("dpop_proofs", "jti_hash", "expires_at <= %(now)s"),
        ("grants", "grant_id", f"old.revoked_at IS NOT NULL AND {_NO_LIVE_CODE}"),
        (
            "grants",
            "grant_id",
            f"old.expires_at <= %(now)s AND {_NO_LIVE_CODE}"
            " AND NOT EXISTS (SELECT 1 FROM access_tokens a WHERE a.grant_id = old.grant_id"
            "  AND a.revoked_at IS NULL AND a.expires_at > %(now)s)"
            " AND NOT EXISTS (SELECT 1 FROM refresh_tokens r WHERE r.grant_id = old.grant_id"
            "  AND r.consumed_at IS NULL AND r.expires_at > %(now)s)",
        ),
    )
) + (
    "UPDATE refresh_tokens SET replay = NULL WHERE token_hash IN (SELECT token_hash FROM refresh_tokens AS old"
    " WHERE replay IS NOT NULL AND grace_until <= %(now)s LIMIT %(limit)s FOR UPDATE SKIP LOCKED)",
)


async def _gc(db, now, batch_size):
    """One short statement per kind, so that requests wait little for its locks."""
    count = 0
    for statement in _GC:
        count += await rowcount(db, statement, {"now": now, "limit": batch_size})
    return count
