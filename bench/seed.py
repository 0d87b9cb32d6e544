"""
Fill an authsrv store with live grants, quickly, for the benchmark's scale
runs: each grant with its consent, one access token and one refresh token,
for users `seed-user-N` (ten grants a user, as many clients as the demo has).
Rows are written through the store's own row mapping (authsrv.store.rows),
so they are exactly what the server writes, in batches inside one
transaction per 50,000 grants.

    .venv/bin/python bench/seed.py --sqlite PATH --grants 1000000
    .venv/bin/python bench/seed.py --dsn postgresql://... --grants 100000

The store is migrated first (created when missing). Prints how long it took
and the store's size.
"""

from __future__ import annotations

import argparse
import hashlib
import sqlite3
import sys
import time
from pathlib import Path

from authsrv.records import AccessToken, Grant, RefreshToken
from authsrv.store.rows import POSTGRES, SQLITE, tables

CLIENTS = ("demo-app", "partner-app", "demo-spa")
SCOPE = frozenset({"openid", "profile", "email", "offline_access"})
CHUNK = 50_000
TTL = 30 * 24 * 3600


def records(start: int, stop: int, now: int):
    """The grant, access token, refresh token and consent of each grant number in [start, stop)."""
    for n in range(start, stop):
        sub = f"seed-user-{n // 10}"
        client = CLIENTS[n % len(CLIENTS)]
        grant = Grant(grant_id=f"seed-grant-{n}", client_id=client, sub=sub, scope=SCOPE, auth_time=now,
                      created_at=now, expires_at=now + TTL)
        access = AccessToken(token_hash=_hash(f"seed-access-{n}"), grant_id=grant.grant_id, client_id=client,
                             sub=sub, scope=SCOPE, issued_at=now, expires_at=now + 3600)
        refresh = RefreshToken(token_hash=_hash(f"seed-refresh-{n}"), grant_id=grant.grant_id, client_id=client,
                               sub=sub, scope=SCOPE, issued_at=now, expires_at=now + TTL)
        yield grant, access, refresh, (sub, client, " ".join(sorted(SCOPE)), now)


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def seed(connection, dialect, grants: int, now: int, placeholder: str, begin: str, many=None) -> None:
    """C{many(cursor, sql, rows)} runs one statement over many rows (default: executemany)."""
    many = many or (lambda cursor, sql, rows: cursor.executemany(sql, rows))
    t = tables(dialect)
    consent = (f"INSERT INTO consents (sub, client_id, scope, created_at) VALUES ({', '.join([placeholder] * 4)})"
               " ON CONFLICT DO NOTHING")
    cursor = connection.cursor()
    done = 0
    while done < grants:
        stop = min(grants, done + CHUNK)
        batch = list(records(done, stop, now))
        if begin:
            cursor.execute(begin)
        many(cursor, t.grants.insert, [t.grants.params(g) for g, _, _, _ in batch])
        many(cursor, t.access.insert, [t.access.params(a) for _, a, _, _ in batch])
        many(cursor, t.refresh.insert, [t.refresh.params(r) for _, _, r, _ in batch])
        many(cursor, consent, [c for _, _, _, c in batch])
        connection.commit() if not begin else cursor.execute("COMMIT")
        done = stop
        print(f"seed: {done:,} of {grants:,} grants", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--sqlite", type=Path, help="the SQLite store's file")
    where.add_argument("--dsn", help="the PostgreSQL store's DSN")
    parser.add_argument("--grants", type=int, required=True)
    args = parser.parse_args()
    now = int(time.time())
    started = time.perf_counter()
    if args.sqlite:
        from authsrv.store import sqlite as store

        store._open(args.sqlite, "OFF", now).close()
        connection = sqlite3.connect(args.sqlite, isolation_level=None)
        connection.execute("PRAGMA synchronous = OFF")
        seed(connection, SQLITE, args.grants, now, "?", "BEGIN")
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.close()
        size = sum(p.stat().st_size for p in args.sqlite.parent.glob(args.sqlite.name + "*"))
    else:
        import psycopg2

        from authsrv.store import postgres as store

        store.migrate(args.dsn, 10, now)
        from psycopg2.extras import execute_batch

        connection = psycopg2.connect(args.dsn)
        seed(connection, POSTGRES, args.grants, now, "%s", "",
             lambda cursor, sql, rows: execute_batch(cursor, sql, rows, page_size=2000))
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
            cursor.execute("SELECT pg_database_size(current_database())")
            size = cursor.fetchone()[0]
        connection.close()
    print(f"seed: {args.grants:,} grants in {time.perf_counter() - started:.1f} s; store size {size / 2**20:,.1f} MiB")


if __name__ == "__main__":
    main()
