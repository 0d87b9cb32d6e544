"""
The keystore conformance suite.

Every keystore (JWK file, PEM folder, PostgreSQL, a third party's dropin) must
publish a key before it signs, keep a retired key published until the tokens
it signed have expired, then keep verifying the id_token_hints it signed for a
browser session's lifetime without publishing it, retire the keys of an
algorithm dropped from its config, and never publish a private member. To run
the suite, subclass L{KeystoreConformance} in a C{Test*} class and define:

  - C{make_keystore(algorithms=("RS256",), rotate_every=None)}: a new,
    empty keystore configured with those algorithms and that rotation period
    in seconds (L{None}: no scheduled rotation), or a L{Deferred} of it;
  - C{reopen_keystore(algorithms=None)}: a second keystore object built from
    the same config as the last C{make_keystore}, as another process would
    (with C{algorithms} in place of the configured ones when given, as after
    the operator changed them), or a L{Deferred} of it.

Keystores are made with a plugin context whose C{session_lifetime} is
L{KeystoreConformance.session_lifetime}.

Times given to the keystore are derived from its own keys' times, so the
suite never reads a clock.
"""

from __future__ import annotations

import inspect
import json

import pytest
import pytest_twisted
from jwcrypto.jwk import JWKSet
from jwcrypto.jws import InvalidJWSSignature
from jwcrypto.jwt import JWT, JWTMissingKey
from zope.interface.verify import verifyObject

from authsrv.interfaces import DROPPED_ALGORITHM_SETTLES as SETTLED, IKeystore
from authsrv.records import KeyInfo

ALL_ALGORITHMS = ("RS256", "PS256", "ES256", "EdDSA")

PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})

CLAIMS = {"iss": "https://issuer.example", "sub": "conformance", "aud": "client"}


async def _resolved(value):
    """Await what a test hook returned, if it is awaitable."""
    return await value if inspect.isawaitable(value) else value


def _header(token: str) -> dict:
    return JWT(jwt=token).token.jose_header


def _verified_claims(token: str, keyset: JWKSet) -> dict:
    return json.loads(JWT(jwt=token, key=keyset).claims)


def _verifies_as_hint(token: str, keystore) -> bool:
    """Whether C{token} verifies with the key C{hint_key} gives for its kid, and with that key's algorithm."""
    header = _header(token)
    key = keystore.hint_key(header["kid"])
    if key is None:
        return False
    assert not key.has_private
    assert key.get("alg") == header["alg"]
    return json.loads(JWT(jwt=token, key=key, algs=[key.get("alg")]).claims) == CLAIMS


def _by_state(keystore, alg: str, state: str) -> list[KeyInfo]:
    return [k for k in keystore.keys() if k.alg == alg and k.state == state]


def _active(keystore, alg: str = "RS256") -> KeyInfo:
    (active,) = _by_state(keystore, alg, "active")
    return active


def _sorted(infos) -> list[KeyInfo]:
    return sorted(infos, key=lambda info: info.kid)


def _published(keystore) -> list[dict]:
    return json.loads(keystore.jwks_bytes())["keys"]


def _published_kids(keystore) -> set[str]:
    return {key["kid"] for key in _published(keystore)}


def _verifies(token: str, keystore) -> bool:
    """Whether C{token} verifies against both forms of the published key set."""
    keysets = (keystore.public_keyset(), JWKSet.from_json(keystore.jwks_bytes()))
    for keyset in keysets:
        try:
            assert _verified_claims(token, keyset) == CLAIMS
        except (JWTMissingKey, InvalidJWSSignature):
            return False
    return True


class KeystoreConformance:
    """The behaviour every L{IKeystore} must show; see the module docstring."""

    session_lifetime = 14 * 86400
    """The C{session_lifetime} of the plugin context the keystores are made with."""

    hint_slack = 3600
    """How long past C{session_lifetime} after its retirement a key may still verify hints."""

    async def _make(self, algorithms=("RS256",), rotate_every=None):
        return await _resolved(self.make_keystore(algorithms=algorithms, rotate_every=rotate_every))

    async def _reopen(self, algorithms=None):
        if algorithms is None:
            return await _resolved(self.reopen_keystore())
        return await _resolved(self.reopen_keystore(algorithms=algorithms))

    @pytest_twisted.ensureDeferred
    async def test_provides_interface(self):
        keystore = await self._make()
        assert verifyObject(IKeystore, keystore)
        assert keystore.algorithms == ("RS256",)
        assert all(isinstance(info, KeyInfo) for info in keystore.keys())

    @pytest_twisted.ensureDeferred
    async def test_signs_with_every_algorithm(self):
        keystore = await self._make(algorithms=ALL_ALGORITHMS)
        assert set(keystore.algorithms) == set(ALL_ALGORITHMS)
        for alg in ALL_ALGORITHMS:
            token = keystore.sign(CLAIMS, alg=alg)
            assert isinstance(token, str)
            assert _header(token) == {"alg": alg, "kid": _active(keystore, alg).kid, "typ": "JWT"}
            assert _verifies(token, keystore)

    @pytest_twisted.ensureDeferred
    async def test_sign_defaults_and_typ(self):
        keystore = await self._make()
        assert _header(keystore.sign(CLAIMS))["alg"] == "RS256"
        token = keystore.sign(CLAIMS, typ="at+jwt")
        assert _header(token)["typ"] == "at+jwt"
        assert _verifies(token, keystore)

    @pytest_twisted.ensureDeferred
    async def test_jwks_has_no_private_member(self):
        keystore = await self._make(algorithms=ALL_ALGORITHMS)
        await keystore.rotate(_active(keystore).activated_at + 60)
        assert isinstance(keystore.jwks_bytes(), bytes)
        published = _published(keystore)
        assert {key["kid"] for key in published} == {info.kid for info in keystore.keys()}
        algs = {info.kid: info.alg for info in keystore.keys()}
        for key in published:
            assert not PRIVATE_MEMBERS & set(key), key["kid"]
            assert key["use"] == "sig"
            assert key["alg"] == algs[key["kid"]]
        assert not any(key.has_private for key in keystore.public_keyset())

    @pytest_twisted.ensureDeferred
    async def test_next_key_published_before_it_signs(self):
        keystore = await self._make(algorithms=ALL_ALGORITHMS)
        for alg in ALL_ALGORITHMS:
            upcoming = _by_state(keystore, alg, "next")
            assert upcoming, f"no next {alg} key"
            assert {info.kid for info in upcoming} <= _published_kids(keystore)
            assert _active(keystore, alg).kid in _published_kids(keystore)
            assert _header(keystore.sign(CLAIMS, alg=alg))["kid"] == _active(keystore, alg).kid

    @pytest_twisted.ensureDeferred
    async def test_rotate(self):
        keystore = await self._make()
        before = _active(keystore)
        (upcoming,) = _by_state(keystore, "RS256", "next")
        published_before = _published_kids(keystore)
        old_token = keystore.sign(CLAIMS)
        now = before.activated_at + 60

        rotation = await keystore.rotate(now)

        assert rotation.rotated is True
        assert _sorted(rotation.keys) == _sorted(keystore.keys())
        assert _active(keystore).kid == upcoming.kid
        assert upcoming.kid in published_before
        (retired,) = _by_state(keystore, "RS256", "retired")
        assert retired.kid == before.kid
        assert retired.expires_at > now
        (new_next,) = _by_state(keystore, "RS256", "next")
        assert new_next.kid not in (before.kid, upcoming.kid)
        assert new_next.kid in _published_kids(keystore)
        assert _header(keystore.sign(CLAIMS))["kid"] == upcoming.kid
        assert _verifies(old_token, keystore)
        assert _verifies(keystore.sign(CLAIMS), keystore)

    @pytest_twisted.ensureDeferred
    async def test_rotate_rotates_each_algorithm(self):
        keystore = await self._make(algorithms=ALL_ALGORITHMS)
        before = {alg: _active(keystore, alg) for alg in ALL_ALGORITHMS}
        upcoming = {alg: _by_state(keystore, alg, "next")[0] for alg in ALL_ALGORITHMS}
        old_tokens = {alg: keystore.sign(CLAIMS, alg=alg) for alg in ALL_ALGORITHMS}

        await keystore.rotate(max(info.activated_at for info in before.values()) + 60)

        for alg in ALL_ALGORITHMS:
            assert _active(keystore, alg).kid == upcoming[alg].kid, alg
            assert [info.kid for info in _by_state(keystore, alg, "retired")] == [before[alg].kid]
            token = keystore.sign(CLAIMS, alg=alg)
            assert _header(token) == {"alg": alg, "kid": upcoming[alg].kid, "typ": "JWT"}
            assert _verifies(token, keystore)
            assert _verifies(old_tokens[alg], keystore)

    @pytest_twisted.ensureDeferred
    async def test_each_key_serves_one_algorithm(self):
        """RS256 and PS256 both use RSA keys, never the same one: each published key names its one alg."""
        keystore = await self._make(algorithms=ALL_ALGORITHMS)
        published = {key["kid"]: key for key in _published(keystore)}
        moduli = {}
        for info in keystore.keys():
            assert published[info.kid]["alg"] == info.alg
            if published[info.kid]["kty"] == "RSA":
                moduli.setdefault(published[info.kid]["n"], set()).add(info.alg)
        assert moduli and all(len(algs) == 1 for algs in moduli.values())
        rs256 = _header(keystore.sign(CLAIMS, alg="RS256"))["kid"]
        ps256 = keystore.sign(CLAIMS, alg="PS256")
        assert _header(ps256)["kid"] != rs256
        assert _verifies(ps256, keystore)

    @pytest_twisted.ensureDeferred
    async def test_refuses_an_algorithm_not_configured(self):
        keystore = await self._make()
        for alg in ALL_ALGORITHMS[1:]:
            assert not _by_state(keystore, alg, "active")
            with pytest.raises(ValueError):
                keystore.sign(CLAIMS, alg=alg)

    @pytest_twisted.ensureDeferred
    async def test_retired_key_dropped_after_retention(self):
        keystore = await self._make()
        old_token = keystore.sign(CLAIMS)
        await keystore.rotate(_active(keystore).activated_at + 60)
        (retired,) = _by_state(keystore, "RS256", "retired")

        await keystore.maintain(retired.expires_at - 1)
        assert _by_state(keystore, "RS256", "retired") == [retired]
        assert _verifies(old_token, keystore)

        await keystore.maintain(retired.expires_at + 1)
        assert retired.kid not in {info.kid for info in keystore.keys()}
        assert retired.kid not in _published_kids(keystore)
        assert not _verifies(old_token, keystore)

    @pytest_twisted.ensureDeferred
    async def test_maintain_rotates_on_schedule(self):
        keystore = await self._make(rotate_every=3600)
        before = _active(keystore)
        (upcoming,) = _by_state(keystore, "RS256", "next")

        await keystore.maintain(before.activated_at + 3599)
        assert _active(keystore) == before

        await keystore.maintain(before.activated_at + 3600)
        assert _active(keystore).kid == upcoming.kid
        assert _header(keystore.sign(CLAIMS))["kid"] == upcoming.kid

    @pytest_twisted.ensureDeferred
    async def test_maintain_without_schedule_never_rotates(self):
        keystore = await self._make()
        before = _active(keystore)
        await keystore.maintain(before.activated_at + 10 * 365 * 86400)
        assert _active(keystore) == before

    @pytest_twisted.ensureDeferred
    async def test_reopen_keeps_keys(self):
        keystore = await self._make(algorithms=ALL_ALGORITHMS)
        await keystore.rotate(_active(keystore).activated_at + 60)
        tokens = {alg: keystore.sign(CLAIMS, alg=alg) for alg in ALL_ALGORITHMS}

        reopened = await self._reopen()

        assert _sorted(reopened.keys()) == _sorted(keystore.keys())
        assert reopened.jwks_bytes() == keystore.jwks_bytes()
        for alg, token in tokens.items():
            assert _verifies(token, reopened)
            assert _header(reopened.sign(CLAIMS, alg=alg))["kid"] == _header(token)["kid"]

    @pytest_twisted.ensureDeferred
    async def test_kids_unique(self):
        keystore = await self._make(algorithms=ALL_ALGORITHMS)
        now = _active(keystore).activated_at
        await keystore.rotate(now + 60)
        await keystore.rotate(now + 120)
        kids = [info.kid for info in keystore.keys()]
        assert len(kids) == len(set(kids)) == len(_published(keystore))

    @pytest_twisted.ensureDeferred
    async def test_reload_picks_up_another_process_rotation(self):
        keystore = await self._make()
        assert await keystore.reload() is False
        (upcoming,) = _by_state(keystore, "RS256", "next")
        other = await self._reopen()

        await other.rotate(_active(other).activated_at + 60)

        assert await keystore.reload() is True
        assert _sorted(keystore.keys()) == _sorted(other.keys())
        assert _header(keystore.sign(CLAIMS))["kid"] == upcoming.kid
        assert await keystore.reload() is False

    @pytest_twisted.ensureDeferred
    async def test_a_rotation_asked_of_a_process_behind_another_adopts_it(self):
        """
        Another process rotated (a worker, the operator command); this one,
        not yet reloaded, is asked to rotate too: it takes the other's
        rotation, and does not promote the next key made an instant before,
        which no relying party has yet; it says so, for whoever asked to
        know that no new rotation happened.
        """
        keystore = await self._make()
        (upcoming,) = _by_state(keystore, "RS256", "next")
        other = await self._reopen()
        now = _active(other).activated_at + 60
        await other.rotate(now)

        rotation = await keystore.rotate(now + 1)

        assert rotation.rotated is False
        assert _sorted(rotation.keys) == _sorted(keystore.keys())
        assert _active(keystore).kid == upcoming.kid
        assert _sorted(keystore.keys()) == _sorted(other.keys())

    @pytest_twisted.ensureDeferred
    async def test_every_published_key_verifies_hints(self):
        keystore = await self._make(algorithms=ALL_ALGORITHMS)
        for alg in ALL_ALGORITHMS:
            assert _verifies_as_hint(keystore.sign(CLAIMS, alg=alg), keystore)
        assert keystore.hint_key("no-such-kid") is None

    @pytest_twisted.ensureDeferred
    async def test_unpublished_key_verifies_hints_for_a_session_lifetime(self):
        """
        A relying party keeps the ID token it got at sign-in for its whole
        session and sends it as id_token_hint: once its key is no longer
        published, the keystore (and another process reading the same keys)
        still verifies it for a browser session's lifetime, never
        publishing it again nor signing with it.
        """
        keystore = await self._make(algorithms=ALL_ALGORITHMS)
        tokens = {alg: keystore.sign(CLAIMS, alg=alg) for alg in ALL_ALGORITHMS}
        now = max(_active(keystore, alg).activated_at for alg in ALL_ALGORITHMS) + 60
        await keystore.rotate(now)
        retired = {alg: _by_state(keystore, alg, "retired")[0] for alg in ALL_ALGORITHMS}
        unpublished = max(info.expires_at for info in retired.values()) + 1

        await keystore.maintain(unpublished)

        other = await self._reopen()
        for alg, token in tokens.items():
            assert retired[alg].kid not in {info.kid for info in keystore.keys()}
            assert retired[alg].kid not in _published_kids(keystore)
            assert not _verifies(token, keystore)
            assert _verifies_as_hint(token, keystore), alg
            assert _verifies_as_hint(token, other), alg
            assert _header(keystore.sign(CLAIMS, alg=alg))["kid"] != retired[alg].kid

        await keystore.maintain(now + self.session_lifetime - 1)
        assert all(_verifies_as_hint(token, keystore) for token in tokens.values())

        await keystore.maintain(now + self.session_lifetime + self.hint_slack)
        assert not any(keystore.hint_key(info.kid) for info in retired.values())
        assert not any(_verifies_as_hint(token, keystore) for token in tokens.values())

    @pytest_twisted.ensureDeferred
    async def test_reload_picks_up_another_process_hint_keys(self):
        keystore = await self._make()
        token = keystore.sign(CLAIMS)
        other = await self._reopen()
        now = _active(other).activated_at + 60
        await other.rotate(now)
        (retired,) = _by_state(other, "RS256", "retired")
        await other.maintain(retired.expires_at + 1)

        assert await keystore.reload() is True

        assert not _verifies(token, keystore)
        assert _verifies_as_hint(token, keystore)

    @pytest_twisted.ensureDeferred
    async def test_dropped_algorithm_retired_like_a_rotated_key(self):
        """
        The operator drops an algorithm from the config: once its active key
        has signed for a day (instances of a rolling deploy that still list
        it are not made to churn keys), it is retired, published only until
        the tokens it signed expire, then kept for hints; its next key,
        which signed nothing, goes with it; a later restart keeps the same
        retirement.
        """
        keystore = await self._make(algorithms=("RS256", "PS256"))
        active, (upcoming,) = _active(keystore, "PS256"), _by_state(keystore, "PS256", "next")
        token = keystore.sign(CLAIMS, alg="PS256")

        dropped = await self._reopen(algorithms=("RS256",))
        assert dropped.algorithms == ("RS256",)
        with pytest.raises(ValueError):
            dropped.sign(CLAIMS, alg="PS256")
        await dropped.maintain(active.activated_at + SETTLED - 1)
        assert _active(dropped, "PS256") == active
        assert _by_state(dropped, "PS256", "next") == [upcoming]

        await dropped.maintain(active.activated_at + SETTLED)

        assert not _by_state(dropped, "PS256", "active") and not _by_state(dropped, "PS256", "next")
        (retired,) = _by_state(dropped, "PS256", "retired")
        assert retired.kid == active.kid
        assert retired.expires_at > retired.retired_at >= active.activated_at
        assert _published_kids(dropped) == {info.kid for info in dropped.keys()}
        assert upcoming.kid not in _published_kids(dropped)
        assert dropped.hint_key(upcoming.kid) is None
        assert _verifies(token, dropped)
        with pytest.raises(ValueError):
            dropped.sign(CLAIMS, alg="PS256")

        restarted = await self._reopen(algorithms=("RS256",))
        assert _by_state(restarted, "PS256", "retired") == [retired]
        assert restarted.jwks_bytes() == dropped.jwks_bytes()

        await restarted.maintain(retired.expires_at - 1)
        assert retired.kid in _published_kids(restarted)
        await restarted.maintain(retired.expires_at + 1)
        assert not [info for info in restarted.keys() if info.alg == "PS256"]
        assert retired.kid not in _published_kids(restarted)
        assert not _verifies(token, restarted)
        assert _verifies_as_hint(token, restarted)
