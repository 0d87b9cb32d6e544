"""
Authorization codes for every store. The token endpoint looks a code up (a
read: no commit), checks it against the request, asks for the user, and only
then redeems it in the one transaction that also writes the tokens: an
exchange costs one durable commit, and a failure before it (an identity
backend down) leaves the code usable. A check that fails refuses the code
instead, which uses it up and revokes its grant, as redeeming it first used
to (RFC 6749 section 10.5).

L{found} decides what a lookup tells, so SQLite, PostgreSQL and the
in-memory store cannot differ in when a code is reused or unknown; the
statements are written once, with the dialect's parameter marks.
"""

from __future__ import annotations

from attrs import frozen

from authsrv.records import NOT_READ, AuthorizationCode, Ban, Grant, NotRead
from authsrv.store.rows import GRANT_PREFIX, Dialect, Lookup, Tables, ban_of, issuable, lookup


@frozen
class CodeFound:
    """
    An unused, unexpired code of a live grant, with that grant, its user's
    ban (None: none) and their linked chat account id (as
    L{authsrv.records.AccessToken.linked_user_id}).
    """

    code: AuthorizationCode
    grant: Grant
    user_ban: Ban | None = None
    linked_user_id: str | None | NotRead = NOT_READ


@frozen
class CodeRedeemed:
    """The code is now used and the tokens are stored."""


@frozen
class CodeReused:
    """
    The code was redeemed before: what it issued must be revoked, when the
    client it was issued to presents it again. C{client_id} is that client,
    as a lookup reads it (None where it was not read: a redemption that
    lost a race, whose client was checked before).
    """

    grant_id: str
    client_id: str | None = None


@frozen
class CodeNotFound:
    """Unknown or expired code, or its grant was revoked."""


def found(code: AuthorizationCode, used: bool, grant: Grant, ban: Ban | None, now: int,
          link: str | None | NotRead = NOT_READ):
    """What a lookup of an existing C{code} tells: a reuse first, whatever else holds."""
    if used:
        return CodeReused(code.grant_id, code.client_id)
    if code.expires_at <= now or grant.revoked_at is not None:
        return CodeNotFound()
    return CodeFound(code, grant, ban, link)


def found_in(tables: Tables, row, now: int):
    """L{found} for the row of L{Statements.find} (None: no such code)."""
    if row is None:
        return CodeNotFound()
    return found(tables.codes.load(row), row["used_at"] is not None, tables.grants.load(row, GRANT_PREFIX),
                 ban_of(row, row["sub"]), now, row["linked_user_id"] if "linked_user_id" in row.keys() else NOT_READ)


@frozen
class Statements:
    """The codes' statements in one dialect; parameters C{hash} and C{now}."""

    find: Lookup[str]
    """The code with its grant (under L{GRANT_PREFIX})."""
    redeem: str
    """Mark the code used if it is unused, unexpired and its grant issuable (L{issuable})."""
    used: str
    """The grant of the code if it was used."""
    refuse: str
    """Mark the code used, whatever its state; returns its grant."""


def find_lookup(tables: Tables, dialect: Dialect, match: str) -> Lookup[str]:
    """The lookup of a code whose hash C{match}es, with its grant (under L{GRANT_PREFIX})."""
    return lookup(
        dialect, "c.*, " + tables.grants.select_as("g", GRANT_PREFIX),
        "authorization_codes c JOIN grants g ON g.grant_id = c.grant_id", "c", f"c.code_hash {match}",
    )


def statements(tables: Tables, dialect: Dialect) -> Statements:
    marks = {name: dialect.mark.format(name) for name in ("hash", "now")}
    return Statements(
        find=find_lookup(tables, dialect, "= " + marks["hash"]),
        redeem=(
            "UPDATE authorization_codes SET used_at = {now}"
            " WHERE code_hash = {hash} AND used_at IS NULL AND expires_at > {now} AND "
        ).format(**marks) + issuable(dialect, "authorization_codes.grant_id"),
        used="SELECT grant_id FROM authorization_codes WHERE code_hash = {hash} AND used_at IS NOT NULL".format(
            **marks
        ),
        refuse=(
            "UPDATE authorization_codes SET used_at = COALESCE(used_at, {now}) WHERE code_hash = {hash}"
            " RETURNING grant_id"
        ).format(**marks),
    )
