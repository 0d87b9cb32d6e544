"""
The JWK-file and PEM-folder keystores: the conformance suite, and what is
particular to keeping private keys in files.
"""

from __future__ import annotations

import json
import stat

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from jwcrypto.jwk import JWK
from twisted.internet.task import Clock

from authsrv.configsection import ConfigError, Section
from authsrv.context import PluginContext
from authsrv.keys import jwkfile, pem
from authsrv.keys.ring import InvalidKeys, KeyRing, Retention
from authsrv.testing.keystore import CLAIMS, PRIVATE_MEMBERS, KeystoreConformance

MAX_TOKEN_LIFETIME = 3600


@pytest.fixture
def context(tmp_path):
    from twisted.internet import reactor

    context = PluginContext(reactor, tmp_path, max_token_lifetime=MAX_TOKEN_LIFETIME)
    yield context
    context.stop()


def _section(data: dict, context) -> Section:
    return Section(dict(data), "keystore", context.base_dir)


class _Harness(KeystoreConformance):
    """Builds keystores of C{module} from a config dict, as the server would."""

    module = None

    @pytest.fixture(autouse=True)
    def _context(self, context):
        self.context = context

    def make_keystore(self, algorithms=("RS256",), rotate_every=None):
        self.config = {"algorithms": list(algorithms)}
        if rotate_every is not None:
            self.config["rotate_every"] = rotate_every
        return self.reopen_keystore()

    def reopen_keystore(self, algorithms=None):
        config = self.config if algorithms is None else self.config | {"algorithms": list(algorithms)}
        return self.module.from_config(_section(config, self.context), self.context)


class TestJwkFileConformance(_Harness):
    module = jwkfile


class TestPemConformance(_Harness):
    module = pem


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _active_kid(keystore, alg="RS256") -> str:
    (kid,) = [k.kid for k in keystore.keys() if k.alg == alg and k.state == "active"]
    return kid


def test_jwk_file_created_0600_with_active_and_next_keys(context, tmp_path):
    keystore = jwkfile.from_config(_section({"algorithms": ["RS256", "EdDSA"]}, context), context)
    path = tmp_path / "keys.jwks.json"
    assert _mode(path) == 0o600
    assert not list(tmp_path.glob(".*.tmp"))
    stored = json.loads(path.read_text())
    assert {key["kid"] for key in stored["keys"]} == {k.kid for k in keystore.keys()}
    assert sorted((k.alg, k.state) for k in keystore.keys()) == [
        ("EdDSA", "active"), ("EdDSA", "next"), ("RS256", "active"), ("RS256", "next"),
    ]
    published = json.loads(keystore.jwks_bytes())["keys"]
    assert [k.kid for k in keystore.keys()] == [JWK(**key).thumbprint() for key in published]


def test_jwk_file_path_is_configurable(context, tmp_path):
    jwkfile.from_config(_section({"path": "data/signing.json"}, context), context)
    assert _mode(tmp_path / "data" / "signing.json") == 0o600


@pytest.mark.parametrize("module, key", [(jwkfile, "path"), (pem, "directory")])
def test_keys_the_system_will_not_store_are_one_line(context, tmp_path, module, key):
    """
    A folder the service's user may not write to (here a name too long, as
    root may write anywhere) stopped the first start with a traceback.
    """
    name = "k" * 300
    with pytest.raises(ConfigError) as raised:
        module.from_config(_section({key: name}, context), context)
    assert raised.value.key == f"keystore.{key}"
    assert raised.value.problem == f"cannot use {tmp_path / name}: File name too long"


def test_jwk_file_readable_by_others_refused(context, tmp_path):
    jwkfile.from_config(_section({}, context), context)
    (tmp_path / "keys.jwks.json").chmod(0o644)
    with pytest.raises(ConfigError) as raised:
        jwkfile.from_config(_section({}, context), context)
    assert raised.value.key == "keystore.path"
    assert "0644" in str(raised.value)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b'{"keys": [{"kty": "oct", "k": "c2VjcmV0", "authsrv": {"state": "active"}}]}',
        b'{"keys": [], "authsrv_hint_keys": {}}',
        b'{"keys": [], "authsrv_hint_keys": [{"kty": "oct", "k": "c2VjcmV0", "authsrv": {"expires_at": 1}}]}',
        b'{"keys": [], "authsrv_hint_keys": [{"kty": "OKP", "crv": "Ed25519",'
        b' "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "authsrv": {"expires_at": "soon"}}]}',
        b'{"keys": [], "authsrv_hint_keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "other",'
        b' "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "authsrv": {"expires_at": 1}}]}',
    ],
)
def test_corrupt_jwk_file_refused_in_one_line(context, tmp_path, content):
    path = tmp_path / "keys.jwks.json"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(ConfigError) as raised:
        jwkfile.from_config(_section({}, context), context)
    assert raised.value.key == "keystore.path"
    assert "\n" not in str(raised.value)


def test_tampered_metadata_refused(context, tmp_path):
    jwkfile.from_config(_section({}, context), context)
    path = tmp_path / "keys.jwks.json"
    stored = json.loads(path.read_text())
    for key in stored["keys"]:
        key["authsrv"].update(state="active", activated_at=key["authsrv"]["created_at"])
    path.write_text(json.dumps(stored))
    with pytest.raises(ConfigError, match="two RS256 keys are active"):
        jwkfile.from_config(_section({}, context), context)


@pytest.mark.parametrize("module", [jwkfile, pem])
@pytest.mark.parametrize(
    "config, key",
    [
        ({"algorithms": ["ES256"]}, "keystore.algorithms"),
        ({"algorithms": ["RS256", "HS256"]}, "keystore.algorithms"),
        ({"rotate_every": "soon"}, "keystore.rotate_every"),
        ({"rotate_every": 0}, "keystore.rotate_every"),
        ({"rotate_every": "59m"}, "keystore.rotate_every"),
        ({"colour": "blue"}, "keystore.colour"),
    ],
)
def test_bad_config_refused(context, module, config, key):
    with pytest.raises(ConfigError) as raised:
        module.from_config(_section(config, context), context)
    assert raised.value.key == key


def test_rotation_schedule_has_a_floor(context):
    with pytest.raises(ConfigError, match="must be at least 1h"):
        jwkfile.from_config(_section({"rotate_every": "59m"}, context), context)


def test_algorithm_added_later_is_provisioned(context):
    first = jwkfile.from_config(_section({}, context), context)
    again = jwkfile.from_config(_section({"algorithms": ["RS256", "ES256"]}, context), context)
    assert _active_kid(again) == _active_kid(first)
    es256 = {(k.alg, k.state) for k in again.keys() if k.alg == "ES256"}
    assert es256 == {("ES256", "active"), ("ES256", "next")}


class _ClockedReactor:
    """The reactor, for its threads, telling the time of a L{Clock}."""

    def __init__(self, reactor, clock: Clock):
        self._reactor = reactor
        self.seconds = clock.seconds

    def __getattr__(self, name):
        return getattr(self._reactor, name)


@pytest.mark.parametrize("module", [jwkfile, pem])
@pytest_twisted.ensureDeferred
async def test_dropped_algorithm_retired_at_the_first_start_without_it(tmp_path, module):
    """
    Its key retires when a start first finds it dropped; starts after keep
    that time, so it leaves the JWKS one retention later whatever restarts.
    """
    from twisted.internet import reactor

    clock = Clock()
    clock.advance(1_800_000_000)
    context = PluginContext(_ClockedReactor(reactor, clock), tmp_path, max_token_lifetime=MAX_TOKEN_LIFETIME)
    try:
        both = module.from_config(_section({"algorithms": ["RS256", "ES256"]}, context), context)
        es256 = _active_kid(both, "ES256")
        clock.advance(86400)
        dropped_at = clock.seconds()
        module.from_config(_section({}, context), context)
        clock.advance(600)
        restarted = module.from_config(_section({}, context), context)
        (retired,) = [k for k in restarted.keys() if k.alg == "ES256"]
        assert (retired.kid, retired.state, retired.retired_at) == (es256, "retired", dropped_at)
        assert retired.expires_at == dropped_at + MAX_TOKEN_LIFETIME + 300

        clock.advance(MAX_TOKEN_LIFETIME)
        await restarted.maintain(int(clock.seconds()))
        assert es256.encode() not in restarted.jwks_bytes()
        assert restarted.hint_key(es256) is not None
    finally:
        context.stop()


@pytest.mark.parametrize("module", [jwkfile, pem])
@pytest_twisted.ensureDeferred
async def test_instances_listing_different_algorithms_do_not_churn_keys(tmp_path, module):
    """
    During a rolling deploy that adds ES256, old instances (RS256 alone) and
    new ones share the keys for a while, each reloading every minute: the new
    ES256 key stays, rather than being retired by one and replaced by the
    other at every reload; a day on, one retirement at most.
    """
    from twisted.internet import reactor

    clock = Clock()
    clock.advance(1_800_000_000)
    context = PluginContext(_ClockedReactor(reactor, clock), tmp_path, max_token_lifetime=MAX_TOKEN_LIFETIME)
    try:
        new = module.from_config(_section({"algorithms": ["RS256", "ES256"]}, context), context)
        old = module.from_config(_section({}, context), context)
        es256 = _active_kid(new, "ES256")
        for _ in range(30):
            clock.advance(60)
            await old.maintain(int(clock.seconds()))
            await new.maintain(int(clock.seconds()))
        assert _active_kid(new, "ES256") == es256
        assert sorted(k.state for k in new.keys() if k.alg == "ES256") == ["active", "next"]

        for _ in range(24 * 60):
            clock.advance(60)
            await old.maintain(int(clock.seconds()))
            await new.maintain(int(clock.seconds()))
        states = sorted(k.state for k in new.keys() if k.alg == "ES256")
        assert states == ["active", "next", "retired"]
        assert es256 in [k.kid for k in new.keys() if k.state == "retired"]
    finally:
        context.stop()


def test_sign_refuses_unconfigured_algorithm(context):
    keystore = jwkfile.from_config(_section({}, context), context)
    with pytest.raises(ValueError):
        keystore.sign(CLAIMS, alg="ES256")


def test_pem_folder_layout(context, tmp_path):
    keystore = pem.from_config(_section({"algorithms": ["RS256", "ES256"]}, context), context)
    folder = tmp_path / "keys"
    kids = {k.kid for k in keystore.keys()}
    assert {p.stem for p in folder.glob("*.pem")} == kids
    assert all(_mode(p) == 0o600 for p in folder.glob("*.pem"))
    for path in folder.glob("*.pem"):
        assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    index = json.loads((folder / "index.json").read_text())
    assert {entry["kid"] for entry in index["keys"]} == kids
    assert "-----" not in (folder / "index.json").read_text()


def _drop_pem(folder, name, jwk: JWK, mode=0o600):
    path = folder / name
    path.write_bytes(jwk.export_to_pem(private_key=True, password=None))
    path.chmod(mode)
    return path


def test_pem_dropped_before_first_start_becomes_active(context, tmp_path):
    folder = tmp_path / "keys"
    folder.mkdir()
    supplied = JWK.generate(kty="EC", crv="P-256")
    _drop_pem(folder, "operator.pem", supplied)
    keystore = pem.from_config(_section({"algorithms": ["RS256", "ES256"]}, context), context)
    assert _active_kid(keystore, "ES256") == supplied.thumbprint()
    assert not (folder / "operator.pem").exists()
    assert (folder / f"{supplied.thumbprint()}.pem").exists()


@pytest_twisted.ensureDeferred
async def test_pem_dropped_while_running_is_adopted_as_next(context, tmp_path):
    keystore = pem.from_config(_section({"algorithms": ["RS256", "ES256"]}, context), context)
    active = _active_kid(keystore, "ES256")
    supplied = JWK.generate(kty="EC", crv="P-256")
    _drop_pem(tmp_path / "keys", "operator.pem", supplied)

    assert await keystore.reload() is True

    (adopted,) = [k for k in keystore.keys() if k.kid == supplied.thumbprint()]
    assert (adopted.alg, adopted.state) == ("ES256", "next")
    assert _active_kid(keystore, "ES256") == active
    assert supplied.thumbprint().encode() in keystore.jwks_bytes()
    reopened = pem.from_config(_section({"algorithms": ["RS256", "ES256"]}, context), context)
    assert {k.kid: k.state for k in reopened.keys()} == {k.kid: k.state for k in keystore.keys()}
    assert await keystore.reload() is False


def test_pem_readable_by_others_refused(context, tmp_path):
    folder = tmp_path / "keys"
    folder.mkdir()
    _drop_pem(folder, "operator.pem", JWK.generate(kty="OKP", crv="Ed25519"), mode=0o644)
    with pytest.raises(ConfigError) as raised:
        pem.from_config(_section({}, context), context)
    assert raised.value.key == "keystore.directory"


def test_pem_of_unsupported_key_type_refused(context, tmp_path):
    folder = tmp_path / "keys"
    folder.mkdir()
    _drop_pem(folder, "operator.pem", JWK.generate(kty="EC", crv="P-384"))
    with pytest.raises(ConfigError, match="unsupported key type EC P-384"):
        pem.from_config(_section({}, context), context)


@pytest_twisted.ensureDeferred
async def test_pem_files_of_dropped_keys_removed(context, tmp_path):
    keystore = pem.from_config(_section({}, context), context)
    retired = _active_kid(keystore)
    now = next(k.activated_at for k in keystore.keys() if k.kid == retired)
    await keystore.rotate(now + 60)
    assert (tmp_path / "keys" / f"{retired}.pem").exists()
    await keystore.maintain(now + 60 + MAX_TOKEN_LIFETIME + 3600)
    assert not (tmp_path / "keys" / f"{retired}.pem").exists()
    assert {p.stem for p in (tmp_path / "keys").glob("*.pem")} == {k.kid for k in keystore.keys()}


def _states(ring: KeyRing, alg: str) -> dict[str, list[str]]:
    found = {"active": [], "next": [], "retired": []}
    for info in ring.infos():
        if info.alg == alg:
            found[info.state].append(info.kid)
    return found


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["rotate", "prune"]), st.integers(0, 3000)), max_size=12))
def test_ring_invariants(operations):
    """
    Whatever sequence of rotations and prunings: one active key, a published
    next key, every key that signed kept until its retention has passed, and
    the persisted form round-trips.
    """
    retention = Retention(published=1000, hints=5000)
    now = 1_000_000
    ring = KeyRing(()).provision(["EdDSA"], now)
    signed_until: dict[str, int] = {}
    for operation, step in operations:
        before = ring
        now += step
        signed_until[_states(before, "EdDSA")["active"][0]] = now
        ring = ring.rotate(now, retention, ["EdDSA"]) if operation == "rotate" else ring.prune(now, retention)
        states = _states(ring, "EdDSA")
        assert len(states["active"]) == 1
        assert states["next"]
        if operation == "rotate":
            assert states["active"][0] in before
        for kid, last in signed_until.items():
            if now < last + retention.published:
                assert kid in ring
            if now < last + retention.hints:
                assert ring.hint_key(kid) is not None
        assert all(info.expires_at > now for info in ring.infos() if info.state == "retired")
        assert all(hint.expires_at > now and hint.kid not in ring for hint in ring.hints)
    published = json.loads(ring.jwks_bytes)["keys"]
    assert [key["kid"] for key in published] == [info.kid for info in ring.infos()]
    assert not any(PRIVATE_MEMBERS & set(key) for key in published)
    restored = KeyRing.from_jwks(json.loads(json.dumps(ring.to_jwks())))
    assert (restored.infos(), restored.hints) == (ring.infos(), ring.hints)


def test_ring_promotes_oldest_next_key():
    ring = KeyRing(()).provision(["EdDSA"], 100)
    (first_next,) = _states(ring, "EdDSA")["next"]
    supplied = JWK.generate(kty="OKP", crv="Ed25519")
    ring = ring.adopt(supplied, 200)
    assert sorted(_states(ring, "EdDSA")["next"]) == sorted([first_next, supplied.thumbprint()])
    rotated = ring.rotate(300, Retention(1000, 5000), ["EdDSA"])
    assert _states(rotated, "EdDSA")["active"] == [first_next]
    assert _states(rotated, "EdDSA")["next"] == [supplied.thumbprint()]
    assert ring.adopt(supplied, 400) is ring


def test_ring_refuses_public_only_key():
    with pytest.raises(InvalidKeys):
        KeyRing(()).adopt(JWK.generate(kty="OKP", crv="Ed25519").public(), 100)
