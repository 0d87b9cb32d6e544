"""
Versioned schema steps and the one runner that applies them, to an SQLite
file or a PostgreSQL database.

A package ships its steps as C{schema/<dialect>/NNN_*.sql}. The runner
applies every step newer than the database's version in one transaction
that first takes the database's write lock (SQLite's C{BEGIN IMMEDIATE}, a
PostgreSQL advisory lock), so that instances starting together apply each
step once, and refuses a database whose schema is newer than this code.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from importlib import resources

from attrs import frozen

_STEP_NAME = re.compile(r"(\d{3})_\w+\.sql")

MIGRATION_LOCK_WAIT = "60s"
"""How long a PostgreSQL instance waits for another one's migration."""

_LOCK_NOT_AVAILABLE = "55P03"

_NOT_NOW = ("08", "25", "40", "53", "55", "57", "58")
"""
SQLSTATE classes that say "not now" rather than that a step is wrong:
connection exceptions, a read-only transaction (a standby), rollbacks
(deadlock), a lock waited for too long (an older instance's long
transaction), insufficient resources, operator intervention, system errors.
"""


def schema_steps(package: str, dialect: str) -> list[tuple[int, str, str]]:
    """(version, file name, SQL) of every C{schema/<dialect>/NNN_*.sql} step of C{package}, in order."""
    folder = resources.files(package).joinpath("schema", dialect)
    steps = []
    for entry in folder.iterdir():
        match = _STEP_NAME.fullmatch(entry.name)
        if match:
            steps.append((int(match[1]), entry.name, entry.read_text(encoding="utf-8")))
    return sorted(steps)


def advisory_lock_id(name: str) -> int:
    """A stable signed 64-bit PostgreSQL advisory lock key for C{name}, clear of other users' small keys."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class MigrationError(Exception):
    """The schema cannot be brought to this version (for example, it is newer)."""


@frozen
class Ledger:
    """
    Where a schema's applied versions are recorded: a table of its own
    (with each step's C{named} file and time, or only the version and the
    server's time), or, with C{component}, rows of a table several
    components share. Every layout is in operators' databases, so all stay.
    """

    table: str
    name: str
    component: str | None = None
    named: bool = False

    def create(self) -> str:
        if self.component is not None:
            return (
                f"CREATE TABLE IF NOT EXISTS {self.table} ("
                " component TEXT NOT NULL, version INTEGER NOT NULL, name TEXT NOT NULL,"
                " applied_at BIGINT NOT NULL, PRIMARY KEY (component, version))"
            )
        if self.named:
            return (
                f"CREATE TABLE IF NOT EXISTS {self.table} ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
            )
        return (
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )

    def current(self, cursor, mark: str) -> int:
        """The version in force; C{mark} is the dialect's parameter placeholder."""
        if self.component is None:
            cursor.execute(f"SELECT coalesce(max(version), 0) FROM {self.table}")
        else:
            cursor.execute(
                f"SELECT coalesce(max(version), 0) FROM {self.table} WHERE component = {mark}", (self.component,)
            )
        return cursor.fetchone()[0]

    def record(self, cursor, mark: str, version: int, name: str, now: int) -> None:
        if self.component is not None:
            cursor.execute(
                f"INSERT INTO {self.table} (component, version, name, applied_at)"
                f" VALUES ({mark}, {mark}, {mark}, {mark})",
                (self.component, version, name, now),
            )
        elif self.named:
            cursor.execute(
                f"INSERT INTO {self.table} (version, name, applied_at) VALUES ({mark}, {mark}, {mark})",
                (version, name, now),
            )
        else:
            cursor.execute(f"INSERT INTO {self.table} (version) VALUES ({mark})", (version,))


class SQLiteMigration:
    """How the runner works on an autocommit C{sqlite3} connection."""

    mark = "?"

    def begin(self, cursor) -> None:
        cursor.execute("BEGIN IMMEDIATE")

    def step_failure(self, error: BaseException) -> str | None:
        """C{error} as one line when it is the step's own (a full disk too: the step could not be written)."""
        return str(error) if isinstance(error, sqlite3.Error) else None

    def run(self, cursor, script: str) -> None:
        """
        The statements one by one: C{executescript} would commit on its
        own, outside the migration's transaction.
        """
        pending = ""
        for line in script.splitlines(keepends=True):
            pending += line
            if sqlite3.complete_statement(pending):
                cursor.execute(pending)
                pending = ""

    def in_transaction(self, connection) -> bool:
        # SQLite rolls back by itself after some errors (disk full, I/O).
        return connection.in_transaction


@frozen
class PostgresMigration:
    """
    How the runner works on an autocommit psycopg2 connection, under the
    advisory lock C{lock}. A step may take long, so no statement timeout
    applies; the wait for the lock is bounded.
    """

    lock: int
    mark = "%s"

    def begin(self, cursor) -> None:
        cursor.execute("BEGIN")
        cursor.execute(f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_WAIT}'; SET LOCAL statement_timeout = 0")
        try:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", (self.lock,))
        except Exception as e:
            if getattr(e, "pgcode", None) != _LOCK_NOT_AVAILABLE:
                raise
            raise MigrationError(
                f"another instance has been migrating the schema for {MIGRATION_LOCK_WAIT}; try again"
            ) from None

    def step_failure(self, error: BaseException) -> str | None:
        """
        C{error} as one line (without PostgreSQL's detail and hint) when it
        is the step's own (SQL the rows refuse, an object already there);
        None when it says "not now", which stays an outage.
        """
        code = getattr(error, "pgcode", None)
        if code is None or code[:2] in _NOT_NOW:
            return None
        return str(error).splitlines()[0]

    def run(self, cursor, script: str) -> None:
        cursor.execute(script)

    def in_transaction(self, connection) -> bool:
        return not connection.closed


def migrate(connection, how, steps: list[tuple[int, str, str]], ledger: Ledger, now: int = 0) -> int:
    """
    Bring a schema to the newest of C{steps} on C{connection}, in one
    transaction begun C{how} (L{SQLiteMigration}, L{PostgresMigration}).
    Returns the version now in force; L{MigrationError} when the database's
    schema is newer than this code, its lock is not had, or a step fails:
    then no step of this run stays applied, and its one line names the
    step and the version kept, so that the operator sees which step
    stopped the start and that nothing changed.
    """
    latest = steps[-1][0] if steps else 0
    cursor = connection.cursor()
    try:
        how.begin(cursor)
        cursor.execute(ledger.create())
        current = ledger.current(cursor, how.mark)
        if current > latest:
            raise MigrationError(
                f"its {ledger.name} schema version {current} is newer than this authsrv knows"
                f" ({latest}); run a newer authsrv"
            )
        for version, name, script in steps:
            if version > current:
                try:
                    how.run(cursor, script)
                except Exception as e:
                    failure = how.step_failure(e)
                    if failure is None:
                        raise
                    raise MigrationError(
                        f"its {ledger.name} schema step {name} failed: {failure};"
                        f" the schema stays at version {current}"
                    ) from e
                ledger.record(cursor, how.mark, version, name, now)
        cursor.execute("COMMIT")
    except BaseException:
        if how.in_transaction(connection):
            cursor.execute("ROLLBACK")
        raise
    finally:
        cursor.close()
    return max(current, latest)
