"""
The PostgreSQL keystore: the conformance suite, two instances sharing one
database, private keys sealed at rest, and its config.
"""

from __future__ import annotations

import json
import threading

import psycopg2
import pytest
import pytest_twisted
from jwcrypto.jwt import JWT
from twisted.internet.defer import gatherResults
from twisted.internet.threads import deferToThread
from twisted.logger import capturedLogs

from authsrv.chat.crypto import new_key_text
from authsrv.configsection import ConfigError, Section, Unreachable
from authsrv.context import PluginContext
from authsrv.keys import postgres
from authsrv.pg.settings import ConnectionSettings
from authsrv.testing.keystore import CLAIMS, PRIVATE_MEMBERS, KeystoreConformance

MAX_TOKEN_LIFETIME = 3600


@pytest.fixture
def contexts(reactor, tmp_path):
    """Plugin contexts, one per simulated server: each has its own keys thread."""
    made: list[PluginContext] = []

    def make() -> PluginContext:
        made.append(PluginContext(reactor, tmp_path, max_token_lifetime=MAX_TOKEN_LIFETIME))
        return made[-1]

    yield make
    for context in made:
        context.stop()


def _open(dsn: str, context, **config) -> postgres.PostgresKeystore:
    return postgres.from_config(Section({"dsn": dsn, **config}, "keystore", context.base_dir), context)


def _rows(dsn: str) -> list[tuple]:
    with psycopg2.connect(dsn) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT kid, state, encrypted, private_jwk FROM signing_keys ORDER BY kid")
        rows = cursor.fetchall()
    connection.close()
    return [(kid, state, encrypted, bytes(private)) for kid, state, encrypted, private in rows]


def _execute(dsn: str, statement: str, parameters=()) -> None:
    connection = psycopg2.connect(dsn)
    connection.autocommit = True
    with connection.cursor() as cursor:
        cursor.execute(statement, parameters)
    connection.close()


def _by_state(keystore, state: str, alg: str = "RS256") -> list:
    return [info for info in keystore.keys() if info.alg == alg and info.state == state]


class TestPostgresConformance(KeystoreConformance):
    @pytest.fixture(autouse=True)
    def _setup(self, pg_dsn, contexts):
        self.dsn = pg_dsn
        self.contexts = contexts

    def make_keystore(self, algorithms=("RS256",), rotate_every=None):
        self.config = {"algorithms": list(algorithms)}
        if rotate_every is not None:
            self.config["rotate_every"] = rotate_every
        return self.reopen_keystore()

    def reopen_keystore(self, algorithms=None):
        config = self.config if algorithms is None else self.config | {"algorithms": list(algorithms)}
        return _open(self.dsn, self.contexts(), **config)


def test_first_start_stores_active_and_next_keys(pg_dsn, contexts):
    keystore = _open(pg_dsn, contexts(), algorithms=["RS256", "EdDSA"])
    assert sorted((k.alg, k.state) for k in keystore.keys()) == [
        ("EdDSA", "active"), ("EdDSA", "next"), ("RS256", "active"), ("RS256", "next"),
    ]
    rows = _rows(pg_dsn)
    assert {row[0] for row in rows} == {k.kid for k in keystore.keys()}
    assert not any(row[2] for row in rows)
    assert all(json.loads(row[3])["d"] for row in rows)


@pytest_twisted.ensureDeferred
async def test_instances_starting_together_share_one_key_set(pg_dsn, contexts):
    first, second = contexts(), contexts()
    a, b = await gatherResults([deferToThread(_open, pg_dsn, first), deferToThread(_open, pg_dsn, second)])
    assert a.jwks_bytes() == b.jwks_bytes()
    assert len(_rows(pg_dsn)) == 2


@pytest_twisted.ensureDeferred
async def test_racing_rotations_rotate_once(pg_dsn, contexts):
    """Two servers asked to rotate at the same moment: one rotation, adopted by the other."""
    a = _open(pg_dsn, contexts())
    b = _open(pg_dsn, contexts())
    (active,) = _by_state(a, "active")
    (upcoming,) = _by_state(a, "next")
    now = active.activated_at + 60

    with capturedLogs() as events:
        await gatherResults([a.rotate(now), b.rotate(now + 1)])

    for keystore in (a, b):
        await keystore.reload()
        assert [k.kid for k in _by_state(keystore, "retired")] == [active.kid]
        assert [k.kid for k in _by_state(keystore, "active")] == [upcoming.kid]
    assert a.jwks_bytes() == b.jwks_bytes()
    assert len(_rows(pg_dsn)) == 3
    rotated = [e for e in events if e.get("event") == "key.rotated"]
    adopted = [e for e in events if e.get("event") == "key_rotation_adopted"]
    assert (len(rotated), len(adopted)) == (1, 1)


@pytest_twisted.ensureDeferred
async def test_racing_maintenance_rotates_once(pg_dsn, contexts):
    a = _open(pg_dsn, contexts(), rotate_every="1h")
    b = _open(pg_dsn, contexts(), rotate_every="1h")
    (active,) = _by_state(a, "active")
    (upcoming,) = _by_state(a, "next")
    due = active.activated_at + 3600

    await gatherResults([a.maintain(due), b.maintain(due), b.maintain(due + 1), a.maintain(due + 2)])

    await gatherResults([a.reload(), b.reload()])
    assert a.jwks_bytes() == b.jwks_bytes()
    for keystore in (a, b):
        assert [k.kid for k in _by_state(keystore, "retired")] == [active.kid]
        assert [k.kid for k in _by_state(keystore, "active")] == [upcoming.kid]


@pytest_twisted.ensureDeferred
async def test_every_instance_publishes_the_next_key_before_it_signs(pg_dsn, contexts):
    a = _open(pg_dsn, contexts(), rotate_every="1h")
    b = _open(pg_dsn, contexts(), rotate_every="1h")
    start = _by_state(a, "active")[0].activated_at
    for hour in range(1, 4):
        now = start + hour * 3600
        published_by_b = {key["kid"] for key in json.loads(b.jwks_bytes())["keys"]}
        await a.maintain(now)
        (signing,) = _by_state(a, "active")
        assert signing.kid in published_by_b
        await b.maintain(now + 30)
        assert b.jwks_bytes() == a.jwks_bytes()
        assert _by_state(b, "active") == [signing]
        assert JWT(jwt=b.sign(CLAIMS)).token.jose_header["kid"] == signing.kid


def test_private_keys_sealed_at_rest(pg_dsn, contexts, tmp_path):
    (tmp_path / "key").write_text(new_key_text())
    keystore = _open(pg_dsn, contexts(), encryption_key_file="key", algorithms=["RS256", "ES256"])
    rows = _rows(pg_dsn)
    assert all(encrypted for _, _, encrypted, _ in rows)
    for _, _, _, private in rows:
        assert b'"d"' not in private and b"kty" not in private
    reopened = _open(pg_dsn, contexts(), encryption_key_file="key", algorithms=["RS256", "ES256"])
    assert reopened.jwks_bytes() == keystore.jwks_bytes()

    with pytest.raises(ConfigError) as raised:
        _open(pg_dsn, contexts(), algorithms=["RS256", "ES256"])
    assert raised.value.key == "keystore.encryption_key_env"
    (tmp_path / "other").write_text(new_key_text())
    with pytest.raises(ConfigError) as raised:
        _open(pg_dsn, contexts(), encryption_key_file="other", algorithms=["RS256", "ES256"])
    assert raised.value.key == "keystore.encryption_key_file"
    assert "cannot decrypt" in str(raised.value)


def test_keys_stored_in_clear_are_sealed_once_a_key_is_given(pg_dsn, contexts, tmp_path):
    plain = _open(pg_dsn, contexts())
    (tmp_path / "key").write_text(new_key_text())
    sealed = _open(pg_dsn, contexts(), encryption_key_file="key")
    assert sealed.jwks_bytes() == plain.jwks_bytes()
    assert all(encrypted for _, _, encrypted, _ in _rows(pg_dsn))


def test_published_keys_have_no_private_member(pg_dsn, contexts):
    keystore = _open(pg_dsn, contexts(), algorithms=["RS256", "ES256", "EdDSA"])
    for key in json.loads(keystore.jwks_bytes())["keys"]:
        assert not PRIVATE_MEMBERS & set(key)


def test_tampered_table_refused(pg_dsn, contexts):
    _open(pg_dsn, contexts())
    _execute(pg_dsn, "UPDATE signing_keys SET state = 'active', activated_at = created_at")
    with pytest.raises(ConfigError, match="two RS256 keys are active") as raised:
        _open(pg_dsn, contexts())
    assert raised.value.key == "keystore"
    _execute(pg_dsn, "UPDATE signing_keys SET private_jwk = 'garbage'")
    with pytest.raises(ConfigError, match="not a JWK"):
        _open(pg_dsn, contexts())


@pytest_twisted.ensureDeferred
async def test_emptied_table_is_an_error_not_new_keys(pg_dsn, contexts):
    keystore = _open(pg_dsn, contexts())
    published = keystore.jwks_bytes()
    _execute(pg_dsn, "DELETE FROM signing_keys")
    with pytest.raises(ConfigError, match="table is empty"):
        await keystore.reload()
    assert keystore.jwks_bytes() == published


def test_keys_made_at_the_first_version_sign_after_the_upgrade(pg_dsn, contexts):
    published = _open(pg_dsn, contexts()).jwks_bytes()
    _execute(pg_dsn, "DROP TABLE signing_key_hints")
    _execute(pg_dsn, "DELETE FROM keystore_schema_version WHERE version > 1")
    upgraded = _open(pg_dsn, contexts())
    assert upgraded.jwks_bytes() == published
    assert upgraded.sign(CLAIMS).count(".") == 2
    with psycopg2.connect(pg_dsn) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT max(version) FROM keystore_schema_version")
        assert cursor.fetchone() == (2,)


def test_schema_newer_than_the_code_refused(pg_dsn, contexts):
    _open(pg_dsn, contexts())
    _execute(pg_dsn, "INSERT INTO keystore_schema_version (version) VALUES (999)")
    with pytest.raises(ConfigError, match="newer than this authsrv knows") as raised:
        _open(pg_dsn, contexts())
    assert not isinstance(raised.value, Unreachable), "a mistake to fix, not an outage to retry"


def test_a_step_that_fails_names_it_and_changes_nothing(pg_dsn, contexts):
    """The steps before the failing one in the same start are undone too."""
    _execute(pg_dsn, "CREATE TABLE signing_key_hints (id integer)")
    with pytest.raises(ConfigError) as raised:
        _open(pg_dsn, contexts())
    assert not isinstance(raised.value, Unreachable), "a mistake to fix, not an outage to retry"
    assert (raised.value.key, raised.value.problem) == (
        "keystore.dsn",
        'its keystore schema step 002_hint_keys.sql failed: relation "signing_key_hints" already exists;'
        " the schema stays at version 0",
    )
    with psycopg2.connect(pg_dsn) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('signing_keys'), to_regclass('keystore_schema_version')")
        assert cursor.fetchone() == (None, None)


@pytest_twisted.ensureDeferred
async def test_database_down_keeps_signing_from_memory(stoppable_postgres, contexts):
    keystore = _open(stoppable_postgres.database(), contexts(), connect_timeout=1)
    stoppable_postgres.stop()
    with pytest.raises(postgres.KeystoreUnavailable):
        await keystore.reload()
    token = keystore.sign(CLAIMS)
    assert token.count(".") == 2
    stoppable_postgres.start()
    assert await keystore.reload() is False


def test_unreachable_database_names_the_dsn_key_without_the_dsn(contexts, tmp_path, monkeypatch):
    from conftest import free_port

    dsn = f"host=127.0.0.1 port={free_port()} user=authsrv password=hunter2-secret dbname=x"
    monkeypatch.setenv("KEYS_DSN", dsn)
    context = contexts()
    with pytest.raises(ConfigError) as raised:
        postgres.from_config(Section({"dsn_env": "KEYS_DSN"}, "keystore", tmp_path), context)
    assert type(raised.value) is Unreachable and raised.value.key == "keystore.dsn_env"
    assert "hunter2" not in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "config, key",
    [
        ({}, "keystore.dsn"),
        ({"dsn": "host=db password=x"}, "keystore.dsn"),
        ({"dsn": "host=db", "dsn_env": "X"}, "keystore.dsn_env"),
        ({"dsn": "not a dsn"}, "keystore.dsn"),
        ({"dsn": "host=db", "algorithms": ["ES256"]}, "keystore.algorithms"),
        ({"dsn": "host=db", "rotate_every": "59m"}, "keystore.rotate_every"),
        ({"dsn": "host=db", "encryption_key": "x"}, "keystore.encryption_key"),
        ({"dsn": "host=db", "encryption_key_env": "NO_SUCH_VARIABLE_HERE"}, "keystore.encryption_key_env"),
        ({"dsn": "host=db", "statement_timeout": 0}, "keystore.statement_timeout"),
        ({"dsn": "host=db", "colour": "blue"}, "keystore.colour"),
    ],
)
def test_bad_config_refused(contexts, tmp_path, config, key):
    with pytest.raises(ConfigError) as raised:
        postgres.from_config(Section(config, "keystore", tmp_path), contexts())
    assert raised.value.key == key


def test_bad_encryption_key_refused(contexts, tmp_path):
    (tmp_path / "key").write_text("too short")
    with pytest.raises(ConfigError) as raised:
        postgres.from_config(
            Section({"dsn": "host=db", "encryption_key_file": "key"}, "keystore", tmp_path), contexts()
        )
    assert raised.value.key == "keystore.encryption_key_file"
    assert "too short" not in str(raised.value)


def test_check_only_touches_nothing(pg_dsn, reactor, tmp_path):
    context = PluginContext(reactor, tmp_path, check_only=True)
    try:
        assert postgres.from_config(Section({"dsn": pg_dsn}, "keystore", tmp_path), context) is None
    finally:
        context.stop()
    connection = psycopg2.connect(pg_dsn)
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('signing_keys')")
        assert cursor.fetchone() == (None,)
    connection.close()


@pytest_twisted.ensureDeferred
async def test_storage_work_stays_off_the_reactor_thread(pg_dsn, contexts, monkeypatch):
    keystore = _open(pg_dsn, contexts())
    threads = []
    connect = ConnectionSettings.connect

    def recording(self, **kwargs):
        threads.append(threading.current_thread())
        return connect(self, **kwargs)

    monkeypatch.setattr(ConnectionSettings, "connect", recording)
    await keystore.maintain(_by_state(keystore, "active")[0].activated_at + 1)
    await keystore.rotate(_by_state(keystore, "active")[0].activated_at + 2)
    assert threads and threading.main_thread() not in threads
