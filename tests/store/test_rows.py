"""
Reading records from rows (authsrv.store.rows): each column layout is worked
out once, then rows are read by position, whatever order their columns come in.
"""

from __future__ import annotations

import sqlite3

from authsrv.records import Ban
from authsrv.store.rows import POSTGRES, SQLITE, tables

COLUMNS = {
    "token_hash": "'t1'", "grant_id": "'g1'", "client_id": "'demo'", "sub": "'alice'", "scope": "'openid profile'",
    "audience": """'["https://api.example/"]'""", "jti": "NULL", "issued_at": "1", "expires_at": "2", "jkt": "NULL",
    "ban_reason": "'spam'", "ban_created_at": "5", "ban_until": "NULL",
}


class CountingRow(sqlite3.Row):
    """An sqlite3.Row that counts the columns looked up by name: each one a scan of the row's names."""

    by_name: list[str] = []

    def __getitem__(self, key):
        if isinstance(key, str):
            CountingRow.by_name.append(key)
        return super().__getitem__(key)


def _row(order: list[str]):
    db = sqlite3.connect(":memory:")
    db.row_factory = CountingRow
    return db.execute("SELECT " + ", ".join(f"{COLUMNS[name]} AS {name}" for name in order)).fetchone()


def test_a_layout_is_worked_out_once_and_its_rows_read_by_position():
    access = tables(SQLITE).access
    order = list(COLUMNS)
    for columns in (order, order[::-1]):
        first, second = _row(columns), _row(columns)
        record = access.load(first)
        assert record.scope == frozenset({"openid", "profile"})
        assert record.audience == ("https://api.example/",)
        assert (record.token_hash, record.sub, record.issued_at, record.expires_at) == ("t1", "alice", 1, 2)
        assert record.user_ban == Ban(sub="alice", reason="spam", created_at=5, until=None)
        CountingRow.by_name.clear()
        assert access.load(second) == record
        # Only the user's ban is read by name; every field of the token by position.
        assert set(CountingRow.by_name) == {"ban_created_at", "ban_reason", "ban_until", "sub"}


def test_json_lists_read_from_sqlite_are_tuples_as_from_postgresql():
    (_, sqlite_decode), (_, postgres_decode) = SQLITE.list, POSTGRES.list
    assert sqlite_decode('["a", "b"]') == postgres_decode(["a", "b"]) == ("a", "b")
    assert sqlite_decode("[]") == ()


def test_a_dict_row_is_read_by_name():
    """PostgreSQL's rows are dicts (authsrv.pg.pool._dicts): their plan keeps the names."""
    access = tables(POSTGRES).access
    row = {"token_hash": "t1", "grant_id": "g1", "client_id": "demo", "sub": "alice", "scope": "openid",
           "audience": ["https://api.example/"], "jti": None, "issued_at": 1, "expires_at": 2, "jkt": None,
           "ban_reason": None, "ban_created_at": None, "ban_until": None}
    record = access.load(row)
    assert (record.token_hash, record.audience, record.user_ban) == ("t1", ("https://api.example/",), None)
    assert access.load(dict(reversed(row.items()))) == record
