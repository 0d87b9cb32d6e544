"""
Importing a Better Auth deployment (docs/migrating-from-better-auth.md):
its users with their password hashes, bans, Discord links, OAuth clients,
consents and live refresh tokens, with every id kept, so C{sub}, C{userId}
and the relying parties' records keep matching.

The source is read in one read-only, repeatable-read transaction (one
consistent snapshot). Store records go in with one
L{authsrv.interfaces.IImportStore.import_batch} (one transaction: all or
nothing); users go into the identity backend after it, one by one, each
skipped when its sub is there already. So a run that fails part way is
completed by running it again, and a second run changes nothing.

Better Auth's OAuth provider stores client secrets and refresh tokens as
the unpadded base64url of their SHA-256; that is the very digest authsrv
stores in hex, so they carry over as they are and keep working without a
new verifier on the token path. A secret Better Auth stored encrypted
cannot be carried over: such a client gets an unusable secret and is named
in the report, to be given a new one (C{authsrv-admin client
rotate-secret}).

One Discord account links one user here (docs/design.md, Linked chat
accounts): of the links Better Auth let several users hold, the one updated
last is imported, and a link whose Discord account is linked to another
user in the store already is left out; the report names each.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from datetime import datetime

import attrs
import psycopg2
import psycopg2.extras
from attrs import frozen

from authsrv import events
from authsrv.chat.crypto import ACCESS, REFRESH
from authsrv.identity.passwords import is_better_auth_hash
from authsrv.interfaces import IUserManagement
from authsrv.operations.clientspec import JWKS_MAX
from authsrv.operations.users import picture_problem
from authsrv.pg.pool import is_outage
from authsrv.protocol.clientauth import PRIVATE_KEY_JWT, SECRET_METHODS, auth_settings_problem
from authsrv.protocol.clients import redirect_uri_problem, stored_client_id_problem
from authsrv.protocol.dpop import is_thumbprint, unoffered_dpop
from authsrv.protocol.targets import backchannel_uri_problem
from authsrv.remote_documents import FetchPolicy, url_problem
from authsrv.records import (
    DEFAULT_GRANT_TYPES,
    IMPORT_KINDS,
    Ban,
    Client,
    Consent,
    Grant,
    ImportBatch,
    LinkedAccount,
    RefreshToken,
    User,
)
from authsrv.tokens import CLIENT_SECRET_KEY, keyed_form, new_token, token_hash

GRANT_PREFIX = "better-auth-"
"""Names the grant made for each imported refresh token (its Better Auth row id follows)."""

_QUERIES = {
    "users": 'SELECT * FROM "user" ORDER BY id',
    "accounts": """SELECT * FROM account WHERE "providerId" IN ('credential', %(provider)s) ORDER BY id""",
    "clients": 'SELECT * FROM "oauthClient" ORDER BY "clientId"',
    "consents": 'SELECT * FROM "oauthConsent" ORDER BY id',
    "refresh_tokens": (
        'SELECT * FROM "oauthRefreshToken" WHERE revoked IS NULL AND "rotatedAt" IS NULL'
        ' AND "expiresAt" > to_timestamp(%(now)s) ORDER BY id'
    ),
}
_COLUMNS = {
    "users": ("user", ("id", "email")),
    "accounts": ("account", ("id", "accountId", "providerId", "userId", "password", "updatedAt")),
    "clients": ("oauthClient", ("clientId",)),
    "consents": ("oauthConsent", ("clientId",)),
    "refresh_tokens": ("oauthRefreshToken", ("id", "token", "clientId", "userId", "expiresAt")),
}
"""Each kind's table and the columns the import cannot do without (the others it reads only when there)."""
_OPTIONAL = ("clients", "consents", "refresh_tokens")
"""Tables of the OAuth provider plugin: a deployment without it has none of them."""


class SourceError(Exception):
    """The source database cannot be read; the text is for the operator."""


class SourceUnavailable(SourceError):
    """The source database did not answer (or went away while read): the same import may work later."""


def _source_error(error: psycopg2.Error, doing: str) -> SourceError:
    """C{error} as the operator's one line, unavailable when the server did not answer rather than refused."""
    kind = SourceUnavailable if is_outage(error) else SourceError
    return kind(f"cannot {doing} the Better Auth database: {_first_line(error)}")


@frozen
class Source:
    """The rows read from a Better Auth database, as dicts by column name."""

    users: list
    accounts: list
    clients: list
    consents: list
    refresh_tokens: list
    legacy_clients: int = 0
    """Clients in C{oauthApplication}, the table of the older C{oidcProvider} plugin, which is not imported."""


def read_source(dsn: str, provider: str, now: int, progress: Callable[[str], None]) -> Source:
    """Read every table needed in one consistent, read-only snapshot (blocking)."""
    try:
        connection = psycopg2.connect(dsn)
    except psycopg2.Error as e:
        raise _source_error(e, "connect to") from None
    try:
        connection.set_session(isolation_level="REPEATABLE READ", readonly=True)
        rows: dict[str, list] = {}
        with connection.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cursor:
            for name, query in _QUERIES.items():
                cursor.execute("SAVEPOINT source_table")
                try:
                    cursor.execute(query, {"provider": provider, "now": now})
                except psycopg2.errors.UndefinedTable:
                    if name not in _OPTIONAL:
                        raise
                    cursor.execute("ROLLBACK TO SAVEPOINT source_table")
                    progress(f"{name}: no such table (no @better-auth/oauth-provider plugin), none to import")
                    rows[name] = []
                    continue
                _check_columns(name, cursor.description)
                rows[name] = [dict(row) for row in cursor.fetchall()]
                progress(f"read {len(rows[name])} {name}")
            return Source(**rows, legacy_clients=_legacy_clients(cursor))
    except psycopg2.Error as e:
        raise _source_error(e, "read") from None
    finally:
        connection.close()


def _legacy_clients(cursor) -> int:
    """How many clients the older C{oidcProvider} plugin's C{oauthApplication} table holds (0 without one)."""
    cursor.execute("""SELECT to_regclass('"oauthApplication"') IS NOT NULL AS present""")
    if not cursor.fetchone()["present"]:
        return 0
    cursor.execute('SELECT count(*) AS n FROM "oauthApplication"')
    return cursor.fetchone()["n"]


def _check_columns(name: str, description) -> None:
    """A table without a column the import needs (renamed, as some adapters do) is a L{SourceError} naming it."""
    table, needed = _COLUMNS[name]
    present = {column.name for column in description}
    for column in needed:
        if column not in present:
            raise SourceError(f'cannot read the Better Auth database: table "{table}" has no column "{column}"'
                              " (this import reads Better Auth's own column names)")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _epoch(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def _list(value) -> list:
    """A jsonb column (a list already) or a JSON text, as a list of strings."""
    value = _json(value)
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def sha256_hex(stored: str | None) -> str | None:
    """
    A Better Auth hashed secret or token (unpadded base64url of a SHA-256) as
    the hex digest authsrv stores; None for any other form (an encrypted
    secret).
    """
    if not stored or len(stored) != 43:
        return None
    try:
        raw = base64.urlsafe_b64decode(stored + "=")
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


@frozen
class Offer:
    """What the server offers that an imported client or token may need: DPoP, and which key set URLs it fetches."""

    dpop: bool = False
    fetching: FetchPolicy = FetchPolicy()


@frozen
class Plan:
    """What an import writes, and what it could not bring over (one line each)."""

    batch: ImportBatch
    users: tuple
    """(User, password hash) pairs."""
    problems: tuple


def _uris(client_id: str, kind: str, uris, problem_of, problems: list[str]) -> list[str]:
    """The C{uris} that pass the rules every client's must (C{problem_of}); each other one is a problem line."""
    kept = []
    for uri in uris:
        if (problem := problem_of(uri)) is None:
            kept.append(uri)
        else:
            problems.append(f"client {client_id}: {kind} not imported: {problem}")
    return kept


def _json(value):
    """A json or jsonb column: as psycopg2 decoded it, or parsed from its text; None when it is no JSON."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return None


def _json_text(value) -> str | None:
    """A JSON column as text (a JWK set Better Auth keeps as text, or a jsonb one), None when empty."""
    return json.dumps(value) if isinstance(value, dict | list) else value or None


def _dpop_binding(confirmation, dpop_offered: bool) -> tuple[bool, str | None]:
    """
    Whether a refresh token's C{confirmation} (RFC 7800 C{cnf}) can be kept
    here, and the DPoP key thumbprint it binds the token to: a binding this
    server cannot check (mutual TLS, or DPoP with C{[dpop]} off) must not
    become no binding.
    """
    value = _json(confirmation)
    if value is None:
        return True, None
    jkt = value.get("jkt") if isinstance(value, dict) and set(value) == {"jkt"} else None
    if dpop_offered and isinstance(jkt, str) and is_thumbprint(jkt):
        return True, jkt
    return False, None


def _binding_kind(confirmation) -> str:
    """The members a C{confirmation} names (C{x5t#S256}: mutual TLS), short enough for a report line."""
    value = _json(confirmation)
    names = ", ".join(sorted(map(str, value))) if isinstance(value, dict) else "not a JSON object"
    return names[:80] or "empty"


def _client_auth(row: dict, secret_key: bytes, problems: list[str]) -> dict | None:
    """
    How a client authenticates, as L{Client} fields, or None (with a
    problem line) when that cannot be carried over. Better Auth stores no
    secret for a private_key_jwt client: it keeps its keys, as taking it
    for a public client would let anyone with its client_id act as it.
    """
    client_id, method, secret = row["clientId"], row.get("tokenEndpointAuthMethod"), row.get("clientSecret")
    if method == "none" or (method is None and not secret):
        return {"secret_hash": None}
    if method == PRIVATE_KEY_JWT:
        return {"secret_hash": None, "token_endpoint_auth_method": PRIVATE_KEY_JWT,
                "jwks": _json_text(row.get("jwks")), "jwks_uri": row.get("jwksUri") or None}
    if method not in (None, *SECRET_METHODS):
        problems.append(f"client {client_id}: it authenticates with {method!r}, which this server does not offer:"
                        " not imported")
        return None
    digest = sha256_hex(secret)
    if digest is None:
        problems.append(f"client {client_id} ({row.get('name') or 'no name'}): its secret is stored encrypted (or"
                        f" not at all) and cannot be carried over: give it a new one (authsrv-admin client"
                        f" rotate-secret {client_id})")
        digest = token_hash(new_token())
    return {"secret_hash": keyed_form(digest, secret_key)}


def _auth_problem(client: Client, offer: Offer) -> str | None:
    """What makes C{client} unusable here, checked as the admin API checks a new client."""
    if client.jwks is not None and len(client.jwks) > JWKS_MAX:
        return f"its jwks is over {JWKS_MAX} characters"
    if client.jwks_uri is not None and (uri_problem := url_problem(client.jwks_uri, offer.fetching)):
        return f"jwks_uri: {uri_problem}"
    if setting_problem := auth_settings_problem(client) or unoffered_dpop(client, offer.dpop):
        return f"{setting_problem[0]}: {setting_problem[1]}"
    return None


def _client(row: dict, *, now: int, secret_key: bytes, offer: Offer, problems: list[str]) -> Client | None:
    """The client of an C{oauthClient} row, or None (with a problem line) when it is not imported."""
    client_id = row["clientId"]
    if row.get("disabled"):
        problems.append(f"client {client_id} is disabled in Better Auth: not imported")
        return None
    if (problem := stored_client_id_problem(client_id)) is not None:
        problems.append(f"client {client_id!r}: its client_id {problem}: not imported")
        return None
    auth = _client_auth(row, secret_key, problems)
    if auth is None:
        return None
    grant_types = tuple(t for t in _list(row.get("grantTypes")) if t in DEFAULT_GRANT_TYPES) or DEFAULT_GRANT_TYPES
    client = Client(
        client_id=client_id,
        redirect_uris=_uris(client_id, "redirect URI", _list(row.get("redirectUris")), redirect_uri_problem,
                            problems),
        post_logout_redirect_uris=_uris(client_id, "post-logout redirect URI",
                                        _list(row.get("postLogoutRedirectUris")), redirect_uri_problem, problems),
        name=row.get("name") or "",
        end_session_enabled=bool(row.get("enableEndSession")),
        first_party=bool(row.get("skipConsent")),
        backchannel_logout_uri=next(iter(_uris(
            client_id, "back-channel logout URI", [row["backchannelLogoutUri"]] if row.get("backchannelLogoutUri")
            else [], backchannel_uri_problem, problems)), None),
        created_at=_epoch(row.get("createdAt")) or now,
        grant_types=grant_types,
        dpop_bound_access_tokens=bool(row.get("dpopBoundAccessTokens")),
        **auth,
    )
    if (problem := _auth_problem(client, offer)) is not None:
        problems.append(f"client {client_id}: {problem}: not imported")
        return None
    return client


def _picture(row: dict, problems: list[str]) -> str | None:
    """
    A user's C{image} as their picture claim when the admin API would take
    it; else None, with a problem line, as the user is still imported.
    """
    image = row.get("image")
    if not image or (problem := picture_problem(image)) is None:
        return image or None
    problems.append(f"user {row['id']} ({row['email']}): imported without a picture: its image {problem}")
    return None


def _with_granted_resources(clients: list[Client], grants: list[Grant]) -> list[Client]:
    """
    C{clients}, each registered for the resources its imported grants name:
    Better Auth lets every client ask for any of its C{validAudiences} (a
    setting, not in its tables), while a token here is only for resources
    its client may request (docs/design.md, Changed clients).
    """
    granted: dict[str, set[str]] = {}
    for grant in grants:
        granted.setdefault(grant.client_id, set()).update(grant.resource)
    return [attrs.evolve(c, resources=(*c.resources, *sorted(granted.get(c.client_id, set()) - set(c.resources))))
            for c in clients]


def plan(source: Source, *, now: int, provider: str, cipher, secret_key: bytes, offer: Offer = Offer()) -> Plan:
    """
    The records to write, made from C{source}: C{cipher} (None without a
    C{[chat]} section) seals the Discord tokens, C{secret_key} keys the
    client secret hashes, C{offer} is what this server offers clients.
    """
    problems: list[str] = []
    subs = {row["id"] for row in source.users}
    credentials = {a["userId"]: a["password"] for a in source.accounts if a["providerId"] == "credential"}
    users, bans = [], []
    for row in source.users:
        password_hash = credentials.get(row["id"])
        if password_hash is None:
            problems.append(f"user {row['id']} ({row['email']}) has no password (social sign-in only): not imported"
                            " into the identity backend; they can sign in once given one")
        elif not is_better_auth_hash(password_hash):
            problems.append(f"user {row['id']} ({row['email']}): the password hash is not in Better Auth's"
                            " scrypt form: not imported")
        else:
            user = User(
                sub=row["id"], login=row["email"], name=row.get("name"), picture=_picture(row, problems),
                email=row["email"], email_verified=bool(row.get("emailVerified")),
            )
            users.append((user, password_hash))
        until = _epoch(row.get("banExpires"))
        if row.get("banned") and (until is None or until > now):
            bans.append(Ban(sub=row["id"], reason=row.get("banReason"), created_at=now, until=until))

    linked = []
    chat_accounts = [a for a in source.accounts if a["providerId"] == provider and a["userId"] in subs]
    if chat_accounts and cipher is None:
        problems.append(f"{len(chat_accounts)} {provider} links not imported: the config has no [chat] section"
                        " with an encryption_key to store their tokens with")
    seen_users: set[str] = set()
    seen_chat_users: dict[str, str] = {}
    for a in sorted(chat_accounts, key=lambda a: a["updatedAt"], reverse=True):
        if cipher is None or a["userId"] in seen_users:
            continue
        if not a.get("accessToken"):
            problems.append(f"{provider} link {a['id']} of user {a['userId']} has no access token: not imported")
            continue
        if a["accountId"] in seen_chat_users:
            problems.append(f"{provider} link {a['id']} of user {a['userId']}: {provider} account {a['accountId']}"
                            f" is linked to user {seen_chat_users[a['accountId']]} too, who keeps it (their link"
                            " was updated last): not imported (one chat account links one user)")
            continue
        seen_users.add(a["userId"])
        seen_chat_users[a["accountId"]] = a["userId"]
        linked.append(LinkedAccount(
            account_id=a["id"], sub=a["userId"], provider=provider, provider_user_id=a["accountId"],
            access_token_enc=cipher.encrypt(a["accessToken"], a["id"], ACCESS),
            refresh_token_enc=None if not a.get("refreshToken") else cipher.encrypt(a["refreshToken"], a["id"], REFRESH),
            scope=" ".join((a.get("scope") or "").replace(",", " ").split()),
            expires_at=_epoch(a.get("accessTokenExpiresAt")) or 0, updated_at=now,
        ))

    if source.legacy_clients:
        problems.append(f"{source.legacy_clients} clients of Better Auth's older oidcProvider plugin (table"
                        " oauthApplication) not imported, nor their consents and tokens: only"
                        " @better-auth/oauth-provider's are; make each again with authsrv-admin client create,"
                        " keeping its client_id")
    made = (_client(row, now=now, secret_key=secret_key, offer=offer, problems=problems) for row in source.clients)
    clients = [client for client in made if client is not None]
    client_ids = {client.client_id for client in clients}

    consents = []
    for row in source.consents:
        if row.get("userId") in subs and row["clientId"] in client_ids:
            consents.append(Consent(row["userId"], row["clientId"], _list(row.get("scopes")),
                                    _epoch(row.get("createdAt")) or now))

    grants, refresh_tokens = [], []
    for row in source.refresh_tokens:
        digest = sha256_hex(row["token"])
        if row["userId"] not in subs or row["clientId"] not in client_ids or digest is None:
            problems.append(f"refresh token {row['id']}: its user or client is not imported, or its hash is not"
                            " a SHA-256: not imported")
            continue
        bound, jkt = _dpop_binding(row.get("confirmation"), offer.dpop)
        if not bound:
            problems.append(f"refresh token {row['id']}: it is bound to a key this server cannot check"
                            f" ({_binding_kind(row.get('confirmation'))}): not imported")
            continue
        grant_id = GRANT_PREFIX + row["id"]
        scope = _list(row.get("scopes"))
        issued_at = _epoch(row.get("createdAt")) or now
        expires_at = int(row["expiresAt"].timestamp())
        grants.append(Grant(
            grant_id=grant_id, client_id=row["clientId"], sub=row["userId"], scope=scope,
            auth_time=_epoch(row.get("authTime")) or issued_at, created_at=issued_at, expires_at=expires_at,
            resource=_list(row.get("resources")),
        ))
        refresh_tokens.append(RefreshToken(
            token_hash=digest, grant_id=grant_id, client_id=row["clientId"], sub=row["userId"], scope=scope,
            issued_at=issued_at, expires_at=expires_at, jkt=jkt,
        ))
    batch = ImportBatch(clients=_with_granted_resources(clients, grants), bans=bans, linked=linked,
                        consents=consents, grants=grants, refresh_tokens=refresh_tokens)
    return Plan(batch=batch, users=tuple(users), problems=tuple(problems))


@frozen
class Report:
    """Counts per kind: found in the source, and written by this run."""

    found: dict
    written: dict
    problems: tuple
    users_location: str | None


def counts_of(found: Plan) -> dict:
    return {"users": len(found.users), **{kind: len(getattr(found.batch, kind)) for kind in IMPORT_KINDS}}


def user_manager(identity):
    """The first identity backend that can write users, or None."""
    for backend in getattr(identity, "backends", (identity,)):
        if IUserManagement.providedBy(backend):
            return backend
    return None


async def _links_held_elsewhere(store, linked) -> list[str]:
    """
    A problem line for each link the store left out because its chat
    account is linked to another user there: its user has no link after
    the import (one whose user had a link already was left out as taken).
    """
    problems = []
    for link in linked:
        if await store.get_linked_account(link.sub, link.provider) is None:
            problems.append(f"{link.provider} link {link.account_id} of user {link.sub}: {link.provider} account"
                            f" {link.provider_user_id} is linked to another user here already: not imported"
                            " (one chat account links one user)")
    return problems


async def import_better_auth(source: Source, *, store, identity, cipher, provider: str, now: int,
                             dry_run: bool, progress: Callable[[str], None], actor: str,
                             offer: Offer = Offer()) -> Report:
    """
    Plan the import of C{source}, and unless C{dry_run} write it (see the
    module docstring); the clients, bans and users it adds are audited as
    C{actor}'s.
    """
    # A dry run writes nothing, not even the server key a new store makes on first use.
    secret_key = b"" if dry_run else await store.server_key(CLIENT_SECRET_KEY)
    found = plan(source, now=now, provider=provider, cipher=cipher, secret_key=secret_key, offer=offer)
    problems = list(found.problems)
    manager = user_manager(identity)
    if manager is None:
        problems.append("no configured identity backend can be written (a static users file or PostgreSQL in"
                        " mode own can): users were not copied; keep reading them from Better Auth (mode"
                        " better-auth) or add them yourself")
    written = {"users": 0, **{kind: 0 for kind in IMPORT_KINDS}}
    if dry_run:
        return Report(counts_of(found), written, tuple(problems), getattr(manager, "users_location", None))
    progress("writing " + ", ".join(f"{n} {kind}" for kind, n in counts_of(found).items() if kind != "users")
             + " in one transaction")
    new_clients = [c for c in found.batch.clients if await store.get_client(c.client_id) is None]
    new_bans = [b for b in found.batch.bans if await store.get_ban(b.sub, now) is None]
    written.update(await store.import_batch(found.batch))
    problems.extend(await _links_held_elsewhere(store, found.batch.linked))
    for client in new_clients:
        events.client_created(client_id=client.client_id, source=client.source, actor=actor)
    for ban in new_bans:
        events.user_banned(sub=ban.sub, reason=ban.reason, until=ban.until, actor=actor)
    if manager is not None:
        for index, (user, password_hash) in enumerate(found.users, 1):
            if await identity.user_by_id(user.sub) is None:
                try:
                    await manager.add_user(user, password_hash)
                except ValueError as e:
                    problems.append(f"user {user.sub} ({user.login}) not added: {e}")
                    continue
                written["users"] += 1
                events.user_created(sub=user.sub, login=user.login, actor=actor)
            if index % 100 == 0:
                progress(f"users: {index} of {len(found.users)}")
    return Report(counts_of(found), written, tuple(problems), getattr(manager, "users_location", None))
