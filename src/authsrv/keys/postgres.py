"""
Signing keys in PostgreSQL, shared by every instance of the server.

The keys and their states live in one table, C{signing_keys}, and the
public hint keys (withdrawn from the JWKS, still verifying id_token_hints)
in C{signing_key_hints}, so every instance verifies them; the key ring
logic and the read-modify-write cycle are the file keystores' own
(L{KeyRing}, L{FileKeystore}), over a storage whose lock is a
transaction-level advisory lock: two instances never change the keys at
once, and each decides what is due on what is stored, so a rotation happens
once between them. A next key is stored with the first active one, and
every instance's L{FileKeystore.maintain} reloads the table each minute, so
all of them publish a next key long before a rotation makes it sign.

Private keys may be sealed at rest (AES-256-GCM, the key from
C{encryption_key_env} or C{_file}). Storage work runs on the keystore's own
thread, on a short blocking psycopg2 session each time; signing reads only
memory.
"""

from __future__ import annotations

import json
from contextlib import closing, contextmanager
from typing import Any, Iterator

import psycopg2
from jwcrypto.common import JWException
from jwcrypto.jwk import JWK

from authsrv.chat.crypto import TokenCipher, UndecryptableToken, key_from_text
from authsrv.configsection import ConfigError, Section, Unreachable
from authsrv.keys.filestore import FileKeystore, read_options
from authsrv.keys.ring import HintKey, InvalidKeys, KeyRing, RingKey
from authsrv.migrations import Ledger, MigrationError, PostgresMigration, advisory_lock_id, migrate, schema_steps
from authsrv.pg.pool import first_line
from authsrv.pg.settings import ConnectionSettings, read_settings

SCHEMA_LOCK = advisory_lock_id("authsrv keystore schema")
KEYS_LOCK = advisory_lock_id("authsrv keystore keys")
LEDGER = Ledger("keystore_schema_version", "keystore")

SEALED = "signing-key"
"""What a sealed private key is bound to, besides its kid (the associated data)."""

_FIELDS = ("kid", "alg", "state", "created_at", "activated_at", "retired_at", "expires_at")


class KeystoreUnavailable(Exception):
    """The keystore's database could not be used; the message is one line, without the DSN."""


def from_config(section: Section, context) -> "PostgresKeystore | None":
    """
    Keys: the connection keys of L{authsrv.pg.settings.read_settings}
    (C{dsn}, or C{dsn_env}/C{dsn_file}; C{connect_timeout},
    C{statement_timeout}); C{algorithms} and C{rotate_every} as for the file
    keystores; optionally C{encryption_key_env} or C{encryption_key_file}
    (base64url of 32 bytes) to seal private keys at rest.
    """
    settings = read_settings(section, "authsrv-keystore")
    algorithms, rotate_every = read_options(section)
    secret_key = section.key(section.secret_source("encryption_key"))
    text = section.secret("encryption_key", required=False)
    try:
        cipher = TokenCipher(key_from_text(text)) if text else None
    except ValueError as e:
        raise ConfigError(secret_key, str(e)) from None
    section.done()
    if context.check_only:
        return None
    table = KeyTable(settings, cipher, secret_key, section.path)
    try:
        table.prepare()
        return PostgresKeystore.open(table, algorithms, rotate_every, context)
    except KeystoreUnavailable as e:
        raise Unreachable(settings.key, str(e)) from None
    except MigrationError as e:
        raise ConfigError(settings.key, str(e)) from None


class KeyTable:
    """
    The storage of a L{PostgresKeystore} (see L{FileKeystore}): the
    C{signing_keys} table, changed only under the advisory lock.
    """

    def __init__(self, settings: ConnectionSettings, cipher: TokenCipher | None, secret_key: str, where: str):
        self._settings = settings
        self._cipher = cipher
        self._secret_key = secret_key
        self._where = where
        self._transaction: Any = None
        """The connection of the transaction L{locked} holds open, else None."""

    @contextmanager
    def _session(self) -> Iterator:
        """A fresh connection, closed after use; database errors become L{KeystoreUnavailable}."""
        try:
            with closing(self._settings.connect()) as connection:
                yield connection
        except psycopg2.Error as e:
            raise KeystoreUnavailable(f"keystore database: {first_line(e)}") from None

    def prepare(self) -> None:
        """
        Create or migrate the table (once, when instances start together).
        L{MigrationError} (a schema newer than this code, a step that fails)
        is the operator's to fix, as the store's: not an outage to retry.
        """
        with self._session() as connection:
            migrate(connection, PostgresMigration(SCHEMA_LOCK), schema_steps("authsrv.keys", "postgres"), LEDGER)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """One transaction holding the keys' advisory lock; what it changed commits at the end."""
        with self._session() as connection, connection.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", (KEYS_LOCK,))
            self._transaction = connection
            try:
                yield
            finally:
                self._transaction = None
            cursor.execute("COMMIT")

    def signature(self):
        """A digest of every key's and hint key's kid, state and times: changes whenever they do."""
        query = (
            "SELECT md5((SELECT coalesce(string_agg(concat_ws(':', kid, state, created_at, activated_at,"
            " retired_at, expires_at), ',' ORDER BY kid), '') FROM signing_keys) || '|' ||"
            " (SELECT coalesce(string_agg(concat_ws(':', kid, expires_at), ',' ORDER BY kid), '')"
            " FROM signing_key_hints))"
        )
        if self._transaction is not None:
            return self._fetch(self._transaction, query)[0][0]
        with self._session() as connection:
            return self._fetch(connection, query)[0][0]

    @staticmethod
    def _fetch(connection, query: str, parameters=()) -> list[tuple]:
        with connection.cursor() as cursor:
            cursor.execute(query, parameters)
            return cursor.fetchall()

    def load(self, now: int, missing_ok: bool) -> tuple[KeyRing, bool]:
        rows = self._fetch(
            self._transaction,
            f"SELECT {', '.join(_FIELDS)}, encrypted, private_jwk FROM signing_keys ORDER BY kid",
        )
        if not rows and not missing_ok:
            raise self._invalid("the signing_keys table is empty")
        hints = self._fetch(self._transaction, "SELECT kid, alg, expires_at, public_jwk FROM signing_key_hints")
        try:
            ring = KeyRing(
                (
                    RingKey.restore(self._open(fields["kid"], encrypted, bytes(private)), fields, f"key {fields['kid']}")
                    for *values, encrypted, private in rows
                    for fields in [dict(zip(_FIELDS, values))]
                ),
                (self._hint(*row) for row in hints),
            )
        except InvalidKeys as e:
            raise self._invalid(str(e)) from None
        resealed = self._cipher is not None and any(not row[-2] for row in rows)
        return ring, not rows or resealed

    @staticmethod
    def _hint(kid: str, alg: str, expires_at: int, public: str) -> HintKey:
        where = f"hint key {kid}"
        try:
            members = json.loads(public)
        except ValueError:
            raise InvalidKeys(f"{where}: not a JWK") from None
        if not isinstance(members, dict):
            raise InvalidKeys(f"{where}: not a JWK")
        return HintKey.restore(members | {"kid": kid, "alg": alg}, expires_at, where)

    def _open(self, kid: str, encrypted: bool, private: bytes) -> JWK:
        cipher = self._cipher if encrypted else None
        if encrypted and cipher is None:
            raise ConfigError(
                self._secret_key,
                "the stored signing keys are encrypted: give the key (encryption_key_env or _file)",
            )
        try:
            text = cipher.decrypt(private, kid, SEALED) if cipher is not None else private.decode("utf-8")
            return JWK.from_json(text)
        except UndecryptableToken as e:
            raise ConfigError(self._secret_key, f"cannot decrypt signing key {kid}: {e}") from None
        except (JWException, ValueError, TypeError):
            raise self._invalid(f"key {kid}: not a JWK") from None

    def _invalid(self, problem: str) -> ConfigError:
        return ConfigError(self._where, f"stored signing keys are not usable: {problem}")

    def save(self, ring: KeyRing, stored: KeyRing) -> None:
        """
        Replace the stored keys and hint keys by C{ring}'s, sealing each
        private key when a cipher is set (hint keys are public only).
        """
        with self._transaction.cursor() as cursor:
            cursor.execute("DELETE FROM signing_keys")
            for key in ring.keys:
                private = key.jwk.export_private()
                sealed = self._cipher.encrypt(private, key.info.kid, SEALED) if self._cipher else private.encode()
                row = {name: getattr(key.info, name) for name in _FIELDS}
                row |= {"encrypted": self._cipher is not None, "private_jwk": psycopg2.Binary(sealed)}
                cursor.execute(
                    f"INSERT INTO signing_keys ({', '.join(row)})"
                    f" VALUES ({', '.join(f'%({name})s' for name in row)})",
                    row,
                )
            cursor.execute("DELETE FROM signing_key_hints")
            for hint in ring.hints:
                cursor.execute(
                    "INSERT INTO signing_key_hints (kid, alg, expires_at, public_jwk) VALUES (%s, %s, %s, %s)",
                    (hint.kid, hint.alg, hint.expires_at, hint.jwk.export_public()),
                )


class PostgresKeystore(FileKeystore):
    """L{FileKeystore} over a L{KeyTable}."""
