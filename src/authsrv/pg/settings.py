"""
Where and how the PostgreSQL plugins connect: the connection keys of their
config sections, blocking sessions for start-up work, and the servers a
DSN names (their addresses: L{authsrv.hostlookup}). Nothing here ever
shows the DSN, which may hold a password.
"""

from __future__ import annotations

import ipaddress

import psycopg2
import psycopg2.extensions
from attrs import field, frozen

from authsrv.configsection import ConfigError, Section

_KEEPALIVES = {"keepalives_idle": "30", "keepalives_interval": "10", "keepalives_count": "3"}
"""So that a server that vanished without closing the connection is noticed."""


@frozen
class ConnectionSettings:
    """
    Where and how to connect. C{key} is the config key the DSN came from,
    named by start-up errors; the DSN itself is never shown.
    """

    dsn: str = field(repr=False)
    key: str
    connect_timeout: int
    statement_timeout: int
    application_name: str

    def parameters(self, target: dict | None = None) -> dict:
        """libpq keyword parameters: the DSN's, with C{target}'s host and address, and keepalives."""
        return {
            "dsn": self.dsn, "fallback_application_name": self.application_name, **_KEEPALIVES, **(target or {}),
        }

    def session_setup(self, *, read_only: bool = False) -> str:
        """
        The statement that sets a new session's statement timeout (and,
        C{read_only}, read-only transactions by default). A statement rather
        than libpq's C{options}, which PgBouncer refuses. Prepared statements
        (L{authsrv.pg.pool.Prepared}) take the generic plan at once: each is
        a lookup by key, and a plan made for one user's values (user-access
        for a user who holds most of the rows) can scan a whole table for
        the next.
        """
        setup = f"SET statement_timeout = {self.statement_timeout * 1000}; SET plan_cache_mode = force_generic_plan"
        return setup + "; SET default_transaction_read_only = on" if read_only else setup

    def connect(self, *, read_only: bool = False):
        """A blocking psycopg2 connection in autocommit mode, for start-up work and the keystore."""
        connection = psycopg2.connect(**self.parameters(), connect_timeout=max(2, self.connect_timeout))
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(self.session_setup(read_only=read_only))
        return connection


def read_settings(section: Section, application_name: str) -> ConnectionSettings:
    """
    The connection keys: C{dsn} (a libpq connection string or URI without a
    password, since config files get copied and committed), or
    C{dsn_env}/C{dsn_file} (one that may hold a password; libpq also finds
    one in C{PGPASSWORD} or C{~/.pgpass}); C{connect_timeout} and
    C{statement_timeout} (durations, at least 1 s, default 5 s).
    """
    given = [name for name in ("dsn", "dsn_env", "dsn_file") if section.has(name)]
    if not given:
        raise section.error("dsn", "is required (or dsn_env, dsn_file when it holds a password)")
    if len(given) > 1:
        raise section.error(given[1], f"give one of dsn, dsn_env, dsn_file, not several ({' and '.join(given)})")
    key = section.key(given[0])
    dsn = section.str("dsn") if given == ["dsn"] else section.secret("dsn")
    try:
        parameters = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        # libpq's message quotes the DSN.
        raise ConfigError(
            key, "is not a PostgreSQL connection string: it is not a libpq connection string or postgresql:// URI"
        ) from None
    if given == ["dsn"] and "password" in parameters:
        raise ConfigError(
            key, "holds a password: put the DSN in dsn_env or dsn_file, or the password in a .pgpass file"
            " or PGPASSWORD, never in the config file",
        )
    timeouts = {}
    for name in ("connect_timeout", "statement_timeout"):
        timeouts[name] = section.duration(name, 5)
        if timeouts[name] < 1:
            raise section.error(name, "must be at least 1s")
    return ConnectionSettings(dsn, key, application_name=application_name, **timeouts)


def targets(dsn: str) -> list[dict]:
    """
    The libpq parameters that pick each server the DSN names, in order.
    The pool tries them one by one, each within C{connect_timeout}: in
    asynchronous mode libpq has no deadline per host, so a first host that
    is powered off would use up the whole attempt and the next never be
    tried (a primary and its standbys with C{target_session_attrs}).
    """
    params = psycopg2.extensions.parse_dsn(dsn)
    if not params.get("host"):
        return [{}]
    hosts = params["host"].split(",")
    ports = params.get("port", "").split(",")
    addresses = params.get("hostaddr", "").split(",")
    return [
        {
            "host": host,
            **({"port": ports[index if len(ports) > 1 else 0]} if params.get("port") else {}),
            **({"hostaddr": addresses[index]} if params.get("hostaddr") else {}),
        }
        for index, host in enumerate(hosts)
    ]


def needs_lookup(host: str) -> bool:
    """A host name, as opposed to an address or a socket folder."""
    if not host or host.startswith("/"):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False

