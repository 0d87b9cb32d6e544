"""
The PostgreSQL store: both conformance suites (the concurrency one with two
separate pools on one database, as two servers would have), then what only
PostgreSQL shows: schema versions and racing migrations, the config
section, and connection failures.
"""

from __future__ import annotations

import threading

import psycopg2
import pytest
import pytest_twisted

from authsrv.configsection import ConfigError, Section
from authsrv.context import PluginContext
from authsrv.plugins import find_factory
from authsrv.store import postgres as postgres_store
from authsrv.testing.store import StoreConcurrencyConformance, StoreConformance

LATEST_VERSION = postgres_store.migrations()[-1][0]


def open_store(dsn: str, **section):
    from twisted.internet import reactor

    return postgres_store.from_config(Section({"dsn": dsn, **section}, "store", "."), PluginContext(reactor, "."))


# Children before the grants they reference.
TABLES = (
    "authorization_codes", "access_tokens", "refresh_tokens", "grants", "clients", "browser_sessions",
    "pending_authorizations", "consents", "bans", "linked_accounts", "link_locks",
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
