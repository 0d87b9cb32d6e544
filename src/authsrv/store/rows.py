"""
Records <-> rows, for both SQL stores.

Each record type maps onto the table columns of its fields' names, the same
in SQLite and PostgreSQL; a L{Dialect} says only what differs: how a
parameter is written, how lists and bytes are kept, and how a row is put in
place of the one with its key.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Generic, TypeVar

import attrs
from attrs import frozen

from authsrv.records import (
    RECOVERY_FACTOR,
    TOTP_FACTOR,
    AccessToken,
    AuthorizationCode,
    AuthorizationRequest,
    Ban,
    BrowserSession,
    Client,
    DeviceAuthorization,
    Factor,
    Grant,
    Interaction,
    LinkAttempt,
    LinkedAccount,
    Passkey,
    PushedRequest,
    RefreshToken,
    TotpFactor,
)

# A codec is an (encode, decode) pair between a record field and its column;
# None for either passes the value as it is.
Codec = tuple[Callable | None, Callable | None]


def scope_text(scope) -> str:
    """Scope tokens never hold spaces (RFC 6749 section 3.3); sorted, equal sets are equal strings."""
    return " ".join(sorted(scope))


SCOPE: Codec = (scope_text, str.split)
WORDS: Codec = (" ".join, str.split)
"""Space-separated words kept in their order (a request's scope as asked)."""
FLAG: Codec = (bool, bool)

LIST = "list"
"""A list of strings: a JSON array in SQLite, a text array in PostgreSQL."""
BLOB = "blob"
"""Bytes (already encrypted by the caller), or None."""


@frozen
class Dialect:
    """What differs between the SQL stores' row statements."""

    mark: str
    """A named parameter, with C{{}} for its name."""
    list: Codec
    blob: Codec
    upsert: bool
    """Put a row with C{ON CONFLICT ... DO UPDATE}, else with C{INSERT OR REPLACE}."""
    key_share: str = ""
    """
    The lock a statement takes on a row it needs to stay (C{FOR KEY SHARE}
    where other transactions run beside it; SQLite runs one writer at a time).
    """

    def codec(self, codec) -> Codec:
        if codec == LIST:
            return self.list
        return self.blob if codec == BLOB else codec


def _bytes(value) -> bytes | None:
    """psycopg2 reads bytea as a memoryview."""
    return None if value is None else bytes(value)


@functools.lru_cache(maxsize=1024)
def _strings(text: str) -> tuple[str, ...]:
    """
    A JSON array of strings as a tuple (as PostgreSQL's arrays are read),
    remembered: the same few lists (a client's resources, amr) come back in
    row after row, and parsing one cost a lookup as much as the rest of its
    row did.
    """
    return tuple(json.loads(text))


SQLITE = Dialect(
    mark=":{}", list=(lambda items: json.dumps(list(items)), _strings), blob=(None, None), upsert=False,
)
POSTGRES = Dialect(mark="%({})s", list=(list, tuple), blob=(None, _bytes), upsert=True, key_share=" FOR KEY SHARE")
MAX_PLANS = 64
"""Column layouts whose reading plan a L{Rows} keeps: one per statement that reads it, and a few per schema version."""


class Rows:
    """
    How one record type maps onto its table. C{derived} fields come from a
    query (a join), never from a column; C{nested} records (field name ->
    their L{Rows}) are kept flat, as their own fields' columns in the same
    row. C{joined} records (field name -> (column prefix, their L{Rows}))
    are read from another table's columns a lookup selected under that
    prefix (L{select_as}), so one query brings both. A row that carries a
    user's ban (the C{ban_*} columns of a join) fills in C{user_ban}.
    """

    def __init__(
        self, dialect: Dialect, record: type, table: str, key: str, derived: tuple[str, ...] = (),
        nested: dict | None = None, joined: dict[str, tuple[str, "Rows"]] | None = None, **codecs,
    ):
        self.record = record
        self.table = table
        self.mark = dialect.mark
        self.nested = nested or {}
        self.joined = joined or {}
        self._plans: dict[tuple, tuple] = {}
        names = {f.name for f in attrs.fields(record)}
        self._with_ban = "user_ban" in names
        fields = [f.name for f in attrs.fields(record) if f.name not in self.nested and f.name not in self.joined]
        codecs = {name: dialect.codec(codec) for name, codec in codecs.items()}
        plain = (None, None)
        self._encoders = [(name, codecs.get(name, plain)[0]) for name in fields if name not in derived]
        self._decoders = [(name, codecs.get(name, plain)[1]) for name in fields]
        self.written = [name for name, _ in self._encoders] + [
            column for rows in self.nested.values() for column in rows.written
        ]
        self.insert = self.insert_as("")
        if dialect.upsert:
            keys = key.split(", ")
            self.put = self.insert + f" ON CONFLICT ({key}) DO UPDATE SET " + ", ".join(
                f"{name} = EXCLUDED.{name}" for name in self.written if name not in keys
            )
        else:
            self.put = "INSERT OR REPLACE" + self.insert[len("INSERT"):]

    def insert_as(self, prefix: str, source: str = "") -> str:
        """
        The INSERT of one record whose parameters are named C{prefix} + field;
        with C{source}, a row is inserted for each row of that query.
        """
        columns = ", ".join(self.written)
        values = ", ".join(self.mark.format(prefix + name) for name in self.written)
        if source:
            return f"INSERT INTO {self.table} ({columns}) SELECT {values} FROM {source}"
        return f"INSERT INTO {self.table} ({columns}) VALUES ({values})"

    def params(self, value, prefix: str = "") -> dict:
        params = {
            prefix + name: getattr(value, name) if encode is None else encode(getattr(value, name))
            for name, encode in self._encoders
        }
        for name, rows in self.nested.items():
            params.update(rows.params(getattr(value, name), prefix))
        return params

    def select_as(self, alias: str, prefix: str) -> str:
        """The select list of this table's columns (as C{alias}) under C{prefix}, for a joined record."""
        return ", ".join(f"{alias}.{name} AS {prefix}{name}" for name, _ in self._decoders)

    def load(self, row, prefix: str = ""):
        """
        The record of C{row} (a dict, or an sqlite3.Row) whose columns carry
        C{prefix}, or None. Which column feeds which field is worked out once
        per column layout (L{_plan}): an sqlite3.Row finds a column by name
        with a scan of its names, so reading a record field by field by name
        cost as much as the query that found it.
        """
        if row is None:
            return None
        layout = (type(row), prefix, tuple(row.keys()))
        plan = self._plans.get(layout)
        if plan is None:
            plan = self._plan(layout)
        fields, joined, with_ban = plan
        values = {name: row[key] if decode is None else decode(row[key]) for name, key, decode in fields}
        for name, rows in self.nested.items():
            values[name] = rows.load(row)
        for name, joined_prefix, rows in joined:
            values[name] = rows.load(row, joined_prefix)
        if with_ban:
            values["user_ban"] = ban_of(row, row["sub"])
        return self.record(**values)

    def _plan(self, layout: tuple) -> tuple:
        """
        How L{load} reads a row of C{layout} (row type, prefix, column names):
        each field present by its column's position (by name in a dict), the
        joined records present, whether the user's ban is there.
        """
        row_type, prefix, keys = layout

        def key(column: str):
            return column if issubclass(row_type, dict) else keys.index(column)

        plan = (
            [(name, key(prefix + name), decode) for name, decode in self._decoders if prefix + name in keys],
            [(name, joined_prefix, rows) for name, (joined_prefix, rows) in self.joined.items()
             if any(column.startswith(joined_prefix) for column in keys)],
            self._with_ban and "ban_created_at" in keys,
        )
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[layout] = plan
        return plan


BEFORE_EVERY_ROW = (-(2**63), "")
"""
The (created_at, id) a listing of a user's grants or sessions starts after
when given none: below every 64-bit time, so one statement, read by the
index in that order, serves the first page and the next alike.
"""
GRANT_PREFIX = "grant__"
"""The column prefix of a grant read with a token or code (L{Rows.select_as}): no column starts with it."""
WITH_BAN = ", b.reason AS ban_reason, b.created_at AS ban_created_at, b.until AS ban_until"
"""The columns by which a token lookup also reads its user's ban, so one round trip tells both."""
LINK_PROVIDER = "link_provider"
"""The parameter naming the chat platform whose link a L{Lookup} reads."""

S = TypeVar("S")


@frozen
class Lookup(Generic[S]):
    """
    A hot lookup of a token or code, with its user's ban, as two statements:
    C{plain}, and C{linked}, which also reads the user's account id at the
    chat platform named by L{LINK_PROVIDER} as C{linked_user_id} (NULL: not
    linked there), so UserInfo and ID tokens need no other round trip. Two
    statements rather than one join on a NULL provider, so that introspection
    and a server without a chat platform read exactly what they did before.
    """

    plain: S
    linked: S

    def pick(self, link_provider: str | None, params: dict) -> tuple[S, dict]:
        """The statement and its parameters, reading C{link_provider}'s link unless it is None."""
        if link_provider is None:
            return self.plain, params
        return self.linked, {**params, LINK_PROVIDER: link_provider}


def lookup(dialect: Dialect, columns: str, source: str, alias: str, where: str) -> Lookup[str]:
    """The L{Lookup} of C{columns} from C{source} C{where}; the user is the C{sub} of C{source}'s C{alias}."""
    banned = f"{source} LEFT JOIN bans b ON b.sub = {alias}.sub"
    link = (f" LEFT JOIN linked_accounts l ON l.sub = {alias}.sub"
            f" AND l.provider = {dialect.mark.format(LINK_PROVIDER)}")
    return Lookup(
        f"SELECT {columns}{WITH_BAN} FROM {banned} WHERE {where}",
        f"SELECT {columns}{WITH_BAN}, l.provider_user_id AS linked_user_id FROM {banned}{link} WHERE {where}",
    )


def unencodable(values) -> bool:
    """
    Whether any text among C{values} holds a lone surrogate (possible in a
    JSON string, impossible in UTF-8): no stored key holds one and the
    drivers refuse to send one, so a lookup by it finds nothing.
    """
    return any(isinstance(value, str) and not value.isascii() and not _utf8(value) for value in values)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def client_exists(dialect: Dialect, client_id: str) -> str:
    """
    Whether the client C{client_id} (a column or a parameter) is stored.
    Where transactions run beside each other its row is locked until the
    statement's transaction ends, so a removal of the client waits for it
    and then removes what it stored (L{authsrv.interfaces.IClientStore.remove_client}).
    """
    return f"EXISTS (SELECT 1 FROM clients c WHERE c.client_id = {client_id}{dialect.key_share})"


def displace_link(dialect: Dialect) -> str:
    """
    Removes the link C{displacing} names (L{displaced}'s parameters) when it
    is still that very link, the same version of it, of the provider account
    being linked (L{authsrv.interfaces.ILinkedAccountStore.link_account}).
    """
    mark = dialect.mark.format
    return (f"DELETE FROM linked_accounts WHERE account_id = {mark('id')} AND version = {mark('version')}"
            f" AND provider = {mark('provider')} AND provider_user_id = {mark('user')}")


def displaced(account: LinkedAccount, displacing: LinkedAccount) -> dict:
    """The parameters of L{displace_link}."""
    return {"id": displacing.account_id, "version": displacing.version, "provider": account.provider,
            "user": account.provider_user_id}


def issuable(dialect: Dialect, grant_id: str) -> str:
    """
    Whether the grant C{grant_id} (a column) may be issued tokens at
    C{now}: not revoked, and its user not banned. Checked in the statement
    that issues, so a ban stored after the flow read none still stops it
    (docs/design.md, Bans: a ban takes effect everywhere at once). Where
    transactions run beside each other the grant's row is locked here,
    before the issuing statement locks its own row: a client's removal,
    which locks the grant and then deletes that row with it, is then
    waited for (or waits) whole, never each waiting for the other.
    """
    return (
        f"EXISTS (SELECT 1 FROM grants g WHERE g.grant_id = {grant_id} AND g.revoked_at IS NULL"
        f" AND NOT {banned(dialect, 'g.sub')}{dialect.key_share})"
    )


def banned(dialect: Dialect, sub: str) -> str:
    """Whether the user C{sub} (a column) has a ban in force at C{now}."""
    now = dialect.mark.format("now")
    return f"EXISTS (SELECT 1 FROM bans b WHERE b.sub = {sub} AND (b.until IS NULL OR b.until > {now}))"


def client_grant(tables: "Tables", dialect: Dialect, prefix: str = "") -> str:
    """
    The INSERT of a new grant (parameters named C{prefix} + field) that
    stores nothing unless its client is stored: a client removed while an
    instance still holds it in its cache starts no grant, so it is issued
    no token.
    """
    where = client_exists(dialect, dialect.mark.format(prefix + "client_id"))
    return tables.grants.insert_as(prefix, f"(SELECT 1) AS one WHERE {where}")


def access_state_sql(dialect: Dialect, users: str = "(SELECT 1) AS one", sub: str = "") -> str:
    """
    user-access's one query, by C{sub} and C{now}: whether the user holds a
    live access or refresh token of a live grant, and their ban in force.
    It starts from the user's live tokens (the partial indexes on C{sub}),
    not from their grants, so a user with thousands of spent grants (every
    sign-in leaves one) costs what a new user does. Given C{users}, a row
    source, and C{sub}, its column of users, a row for each of them.
    """
    sub, now = sub or dialect.mark.format("sub"), dialect.mark.format("now")
    live = ("SELECT 1 FROM {table} t JOIN grants g ON g.grant_id = t.grant_id"
            " WHERE t.sub = " + sub + " AND t.{spent} IS NULL AND t.expires_at > " + now + " AND g.revoked_at IS NULL")
    return (
        "SELECT " + sub + " AS sub, (EXISTS (" + live.format(table="access_tokens", spent="revoked_at") + ")"
        " OR EXISTS (" + live.format(table="refresh_tokens", spent="consumed_at") + ")) AS has_grant" + WITH_BAN
        + " FROM " + users + " LEFT JOIN bans b ON b.sub = " + sub
        + " AND (b.until IS NULL OR b.until > " + now + ")"
    )


def access_lookup(dialect: Dialect, match: str) -> Lookup[str]:
    """
    The lookup of an active access token (unexpired at C{now}, neither it
    nor its grant revoked) whose hash C{match}es.
    """
    return lookup(
        dialect, "a.*", "access_tokens a JOIN grants g ON g.grant_id = a.grant_id", "a",
        f"a.token_hash {match} AND a.revoked_at IS NULL AND a.expires_at > {dialect.mark.format('now')}"
        " AND g.revoked_at IS NULL",
    )


def refresh_lookup(tables: "Tables", dialect: Dialect, match: str) -> Lookup[str]:
    """
    The lookup of a refresh token in any state whose hash C{match}es, with
    C{revoked} and its grant (under L{GRANT_PREFIX}).
    """
    return lookup(
        dialect, "r.*, g.revoked_at IS NOT NULL AS revoked, " + tables.grants.select_as("g", GRANT_PREFIX),
        "refresh_tokens r JOIN grants g ON g.grant_id = r.grant_id", "r", f"r.token_hash {match}",
    )


@frozen
class TokenLookups:
    """The token lookups of both SQL stores, by the parameter C{hash}."""

    access: Lookup[str]
    """An active access token (unexpired at C{now}, neither it nor its grant revoked)."""
    refresh: Lookup[str]
    """A refresh token in any state, with C{revoked} and its grant (under L{GRANT_PREFIX})."""


def token_lookups(tables: "Tables", dialect: Dialect) -> TokenLookups:
    mark = dialect.mark.format
    return TokenLookups(
        access=access_lookup(dialect, "= " + mark("hash")),
        refresh=refresh_lookup(tables, dialect, "= " + mark("hash")),
    )


def factors_of(totp: TotpFactor | None, recovery) -> list[Factor]:
    """
    A user's factors from their TOTP row and the (count, created_at) row of
    their unused recovery codes.
    """
    factors = [] if totp is None else [Factor(kind=TOTP_FACTOR, created_at=totp.created_at)]
    if recovery is not None and recovery["remaining"]:
        factors.append(Factor(kind=RECOVERY_FACTOR, created_at=recovery["created_at"],
                              remaining=recovery["remaining"]))
    return factors


def ban_of(row, sub: str) -> Ban | None:
    if row["ban_created_at"] is None:
        return None
    return Ban(sub=sub, reason=row["ban_reason"], created_at=row["ban_created_at"], until=row["ban_until"])


@frozen
class Tables:
    """The row mapping of every stored record, in one dialect."""

    clients: Rows
    sessions: Rows
    interactions: Rows
    link_attempts: Rows
    pushed: Rows
    grants: Rows
    codes: Rows
    devices: Rows
    access: Rows
    refresh: Rows
    bans: Rows
    linked: Rows
    totp: Rows
    passkeys: Rows


def tables(dialect: Dialect) -> Tables:
    def rows(*args, **kwargs):
        return Rows(dialect, *args, **kwargs)

    grants = rows(Grant, "grants", "grant_id", scope=SCOPE, resource=LIST, amr=LIST)
    return Tables(
        clients=rows(
            Client, "clients", "client_id",
            redirect_uris=LIST, post_logout_redirect_uris=LIST, resources=LIST, grant_types=LIST, audiences=LIST,
            scopes=LIST,
            end_session_enabled=FLAG, first_party=FLAG, introspect_any=FLAG, require_mfa=FLAG,
            require_pushed_authorization_requests=FLAG,
            dpop_bound_access_tokens=FLAG, sealed_secret=BLOB,
        ),
        sessions=rows(BrowserSession, "browser_sessions", "session_hash", amr=LIST),
        interactions=rows(
            Interaction, "interactions", "interaction_id", amr=LIST,
            nested={
                "request": rows(
                    AuthorizationRequest, "interactions", "interaction_id",
                    scope=WORDS, resources=LIST, prompt=SCOPE, acr_values=LIST, device=FLAG,
                ),
            },
        ),
        link_attempts=rows(LinkAttempt, "link_attempts", "state_hash"),
        pushed=rows(PushedRequest, "pushed_requests", "uri_hash"),
        grants=grants,
        codes=rows(AuthorizationCode, "authorization_codes", "code_hash", scope=SCOPE, resource=LIST, amr=LIST),
        devices=rows(DeviceAuthorization, "device_authorizations", "device_code_hash", scope=SCOPE, resource=LIST),
        access=rows(
            AccessToken, "access_tokens", "token_hash", derived=("user_ban", "linked_user_id"), scope=SCOPE,
            audience=LIST,
        ),
        refresh=rows(
            RefreshToken, "refresh_tokens", "token_hash", derived=("revoked", "user_ban", "linked_user_id"),
            joined={"grant": (GRANT_PREFIX, grants)}, scope=SCOPE, revoked=FLAG, replay=BLOB,
        ),
        bans=rows(Ban, "bans", "sub"),
        linked=rows(
            LinkedAccount, "linked_accounts", "sub, provider", access_token_enc=BLOB, refresh_token_enc=BLOB,
        ),
        totp=rows(TotpFactor, "totp_factors", "sub", secret_enc=BLOB),
        passkeys=rows(Passkey, "passkeys", "credential_id", public_key=BLOB, transports=LIST,
                      backup_eligible=FLAG, backup_state=FLAG),
    )


def import_statements(tables: Tables, dialect: Dialect) -> dict:
    """
    For each kind of L{authsrv.records.IMPORT_KINDS}: the statement that
    writes one record unless its key is taken (C{rowcount} 1 when written),
    and the function giving its parameters.
    """
    skip = (lambda sql: sql + " ON CONFLICT DO NOTHING") if dialect.upsert else (
        lambda sql: "INSERT OR IGNORE" + sql[len("INSERT"):]
    )
    mark = dialect.mark.format
    statements: dict[str, tuple[str, Callable[[Any], dict]]] = {
        kind: (skip(rows.insert), rows.params)
        for kind, rows in (
            ("clients", tables.clients), ("bans", tables.bans), ("linked", tables.linked),
            ("grants", tables.grants), ("refresh_tokens", tables.refresh),
        )
    }
    consent = skip(
        "INSERT INTO consents (sub, client_id, scope, created_at)"
        f" VALUES ({mark('sub')}, {mark('client_id')}, {mark('scope')}, {mark('created_at')})"
    )
    statements["consents"] = (consent, lambda c: {
        "sub": c.sub, "client_id": c.client_id, "scope": scope_text(c.scope), "created_at": c.created_at,
    })
    return statements
