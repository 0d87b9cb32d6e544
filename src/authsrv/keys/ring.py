"""
The key ring: which signing keys exist and in which state, without any I/O.

A ring is immutable: a rotation, a pruning or an adoption returns a new ring.
Besides the published keys it holds hint keys: the public part of keys
withdrawn from the JWKS, kept to verify the id_token_hints they signed.
So the reactor thread keeps signing with one ring while a thread builds the
next one, and the public JWK set is serialized once per ring, never per
request. Times are integer seconds given by the caller.
"""

from __future__ import annotations

import base64
from typing import Any, Callable, Iterable, Mapping, Sequence

from attrs import evolve, field, frozen
from jwcrypto.common import JWException
from jwcrypto.jwa import JWA
from jwcrypto.jwk import JWK, JWKSet

from authsrv.compactjson import compact
from authsrv.interfaces import DROPPED_ALGORITHM_SETTLES as SETTLED
from authsrv.records import KeyInfo

_RSA = ("RS256", "PS256")
"""The algorithms of RSA keys: each key serves one, the C{alg} it is published with, so verifiers can pin it."""

_GENERATE: dict[str, dict[str, str | int]] = {
    "RS256": {"kty": "RSA", "size": 2048},
    "PS256": {"kty": "RSA", "size": 2048},
    "ES256": {"kty": "EC", "crv": "P-256"},
    "EdDSA": {"kty": "OKP", "crv": "Ed25519"},
}

STATES = ("active", "next", "retired")

_TIMES = ("created_at", "activated_at", "retired_at", "expires_at")

_REQUIRED_TIMES = {
    "next": ("created_at",),
    "active": ("created_at", "activated_at"),
    "retired": ("created_at", "retired_at", "expires_at"),
}

HINTS = "authsrv_hint_keys"
"""The member of the persisted JWK set listing the hint keys (public JWKs only)."""

META = "authsrv"
"""
The member of a persisted private JWK that holds its state and times (RFC 7517
lets a JWK carry members others ignore, so the file stays a valid JWK set).
"""


class InvalidKeys(ValueError):
    """Stored keys that cannot be used as they are; the message is one line."""


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def algorithm_of(jwk: JWK, named: str | None = None) -> str:
    """
    The JWS algorithm a key serves, from its type, so that a key can never
    be used with an algorithm it was not made for. Only an RSA key may serve
    two: the algorithm C{named} for it (in its metadata or its JWK's C{alg}),
    RS256 when none is.
    """
    kty, crv = jwk.get("kty"), jwk.get("crv")
    if kty == "RSA":
        if jwk.get_op_key("verify").key_size < 2048:
            raise InvalidKeys("RSA keys must have at least 2048 bits")
        alg = named or jwk.get("alg") or "RS256"
        if alg not in _RSA:
            raise InvalidKeys(f"an RSA key serves RS256 or PS256, not {alg!r}")
        return alg
    if kty == "EC" and crv == "P-256":
        return "ES256"
    if kty == "OKP" and crv == "Ed25519":
        return "EdDSA"
    raise InvalidKeys(
        f"unsupported key type {kty}{' ' + crv if crv else ''};"
        " use RSA (2048 bits or more, for RS256 or PS256), EC P-256 or Ed25519"
    )


def _labelled(jwk: JWK, alg: str) -> JWK:
    """Stamp the members every published key carries: its thumbprint kid, use and alg."""
    jwk.update(kid=jwk.thumbprint(), use="sig", alg=alg)
    return jwk


def generate(alg: str) -> JWK:
    """A new private key for C{alg}; slow for RSA, so keep it off the reactor thread."""
    return _labelled(JWK.generate(**_GENERATE[alg]), alg)


@frozen
class RingKey:
    """One private key with its public facts."""

    jwk: JWK = field(eq=False, repr=False)
    info: KeyInfo

    @classmethod
    def new(cls, alg: str, state: str, now: int) -> "RingKey":
        jwk = generate(alg)
        activated = now if state == "active" else None
        return cls(jwk, KeyInfo(jwk["kid"], alg, state, now, activated_at=activated))

    @classmethod
    def restore(cls, jwk: JWK, fields: Mapping, where: str) -> "RingKey":
        """
        A stored key, checked against its metadata C{fields} (state and times,
        plus kid and alg where the JWK itself lacks them).
        """
        try:
            if not jwk.has_private:
                raise InvalidKeys("has no private part")
            alg = algorithm_of(jwk, fields.get("alg"))
            kid = jwk.thumbprint()
        except InvalidKeys as e:
            raise InvalidKeys(f"{where}: {e}") from None
        except (JWException, ValueError, TypeError) as e:
            raise InvalidKeys(f"{where}: not a usable key ({_one_line(e)})") from None
        for name, expected in (("kid", kid), ("alg", alg), ("use", "sig")):
            for found in (fields.get(name), jwk.get(name)):
                if found is not None and found != expected:
                    raise InvalidKeys(
                        f"{where}: {name} {found!r} does not match the key ({expected})"
                    )
        state = fields.get("state")
        if state not in STATES:
            raise InvalidKeys(f"{where}: state must be next, active or retired, not {state!r}")
        times: dict[str, Any] = {name: fields.get(name) for name in _TIMES}
        for name, value in times.items():
            if value is None and name in _REQUIRED_TIMES[state]:
                raise InvalidKeys(f"{where}: {name} is required for a key in state {state}")
            if value is not None and (type(value) is not int or value < 0):
                raise InvalidKeys(f"{where}: {name} must be seconds since the epoch")
        return cls(_labelled(jwk, alg), KeyInfo(kid, alg, state, **times))

    def metadata(self) -> dict:
        """State and times, as persisted beside the key."""
        info = self.info
        return {"state": info.state} | {name: getattr(info, name) for name in _TIMES}


@frozen
class HintKey:
    """
    The public part of a key withdrawn from the JWKS: it verifies the
    id_token_hints it signed until C{expires_at}, since relying parties keep
    an ID token for their whole session, but it is never published and
    never signs.
    """

    jwk: JWK = field(eq=False, repr=False)
    kid: str
    alg: str
    expires_at: int

    @classmethod
    def of(cls, key: RingKey, expires_at: int) -> "HintKey":
        return cls(key.jwk.public(), key.info.kid, key.info.alg, expires_at)

    @classmethod
    def restore(cls, members: Mapping, expires_at, where: str) -> "HintKey":
        """A stored hint key: a public JWK's C{members} and its expiry, checked."""
        try:
            jwk = JWK(**members)
            if jwk.has_private:
                raise InvalidKeys("a hint key must be public only")
            alg = algorithm_of(jwk, members.get("alg"))
            kid = jwk.thumbprint()
        except InvalidKeys as e:
            raise InvalidKeys(f"{where}: {e}") from None
        except (JWException, ValueError, TypeError, KeyError) as e:
            raise InvalidKeys(f"{where}: not a usable public key ({_one_line(e)})") from None
        if members.get("kid", kid) != kid:
            raise InvalidKeys(f"{where}: kid {members['kid']!r} does not match the key ({kid})")
        if type(expires_at) is not int or expires_at < 0:
            raise InvalidKeys(f"{where}: expires_at must be seconds since the epoch")
        return cls(_labelled(jwk, alg), kid, alg, expires_at)

    def to_entry(self) -> dict:
        """The persisted form: the public JWK with its expiry in its metadata member."""
        return self.jwk.export_public(as_dict=True) | {META: {"expires_at": self.expires_at}}

    @classmethod
    def from_entry(cls, entry, where: str) -> "HintKey":
        """The inverse of L{to_entry}."""
        if not isinstance(entry, dict) or not isinstance(entry.get(META), dict):
            raise InvalidKeys(f"{where}: not a JWK with its {META!r} metadata")
        members = {name: value for name, value in entry.items() if name != META}
        return cls.restore(members, entry[META].get("expires_at"), where)


@frozen
class Retention:
    """
    How long a key that stopped signing stays useful, in seconds after its
    retirement: C{published} in the JWKS (the longest token lifetime and
    some skew), then, as a hint key, until C{hints} (a browser session's
    lifetime and the same skew).
    """

    published: int
    hints: int


def _retirement(key: RingKey) -> tuple[int, int] | None:
    """A retired key's retirement and the end of its publication (both checked on load); None for a key in use."""
    info = key.info
    if info.state != "retired" or info.retired_at is None or info.expires_at is None:
        return None
    return info.retired_at, info.expires_at


def _retired(key: RingKey, now: int, retention: Retention) -> RingKey:
    info = evolve(key.info, state="retired", retired_at=now, expires_at=now + retention.published)
    return evolve(key, info=info)


def _order(key: RingKey):
    return (STATES.index(key.info.state), key.info.alg, key.info.created_at, key.info.kid)


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


class KeyRing:
    """
    Every key held, each alg with at most one active key. Built once per
    change, with its public JWK set serialized and parsed right away.
    """

    def __init__(self, keys: Iterable[RingKey], hints: Iterable[HintKey] = ()):
        self.keys = tuple(sorted(keys, key=_order))
        kids = [key.info.kid for key in self.keys]
        held = set(kids)
        if len(held) != len(kids):
            raise InvalidKeys("the same key is listed twice")
        self.hints = tuple(sorted(
            (hint for hint in hints if hint.kid not in held), key=lambda h: (h.alg, h.expires_at, h.kid)
        ))
        if len({hint.kid for hint in self.hints}) != len(self.hints):
            raise InvalidKeys("the same hint key is listed twice")
        self._active: dict[str, RingKey] = {}
        for key in self.keys:
            if key.info.state == "active":
                if key.info.alg in self._active:
                    raise InvalidKeys(f"two {key.info.alg} keys are active")
                self._active[key.info.alg] = key
        public = [key.jwk.export_public(as_dict=True) for key in self.keys]
        self.jwks_bytes = compact({"keys": public})
        self._signers: dict[tuple[str, str], tuple[bytes, Any, JWK]] = {}
        self.public_keyset = JWKSet()
        self._verifiers = {hint.kid: hint.jwk for hint in self.hints}
        for key in self.keys:
            self._verifiers[key.info.kid] = verifier = key.jwk.public()
            self.public_keyset.add(verifier)

    def hint_key(self, kid: str) -> JWK | None:
        """The public key C{kid} names among the published and the hint keys, for an id_token_hint."""
        return self._verifiers.get(kid)

    def infos(self) -> list[KeyInfo]:
        return [key.info for key in self.keys]

    def __contains__(self, kid: str) -> bool:
        return any(key.info.kid == kid for key in self.keys)

    def _of(self, alg: str, state: str) -> list[RingKey]:
        found = [k for k in self.keys if k.info.alg == alg and k.info.state == state]
        return sorted(found, key=lambda k: k.info.created_at)

    def provision(self, algorithms: Iterable[str], now: int) -> "KeyRing":
        """
        Give each algorithm what it lacks: an active key (the oldest next key
        when there is one, since it has already been published) and a next
        key, published before it ever signs. Returns C{self} if none lacked.
        """
        keys = list(self.keys)
        for alg in algorithms:
            upcoming = self._of(alg, "next")
            if alg not in self._active:
                if upcoming:
                    promoted = upcoming.pop(0)
                    keys[keys.index(promoted)] = _activated(promoted, now)
                else:
                    keys.append(RingKey.new(alg, "active", now))
            if not upcoming:
                keys.append(RingKey.new(alg, "next", now))
        return self if keys == list(self.keys) else KeyRing(keys, self.hints)

    def withdraw(self, algorithms: Iterable[str], now: int, retention: Retention) -> "KeyRing":
        """
        Stop signing with the algorithms not among C{algorithms} whose
        active key has signed for L{SETTLED} (or that have none): retire
        their active keys as a rotation does, so the tokens they signed
        verify until they expire, and drop their next keys, which signed
        nothing. Returns C{self} if no key was of such an algorithm.

        The wait is for instances sharing the keys that still list the
        algorithm, as during a rolling deploy: they make it a new active
        key whenever it has none, which would otherwise be retired again at
        once, a new key in the JWKS at every reload for as long as the
        instances disagree.
        """
        kept = set(algorithms)
        young = {alg for alg, key in self._active.items()
                 if alg not in kept and key.info.activated_at is not None and key.info.activated_at + SETTLED > now}
        stopped = [k for k in self.keys
                   if k.info.alg not in kept and k.info.alg not in young and k.info.state != "retired"]
        if not stopped:
            return self
        keys = [k for k in self.keys if k not in stopped]
        keys += [_retired(k, now, retention) for k in stopped if k.info.state == "active"]
        return KeyRing(keys, self.hints)

    def rotate(self, now: int, retention: Retention, algorithms: Sequence[str]) -> "KeyRing":
        """
        For each of C{algorithms}: retire the active key (published until
        C{now + retention.published}), promote the oldest next key and
        generate a new next key unless another one is waiting; prune.
        """
        pruned = self.prune(now, retention)
        keys = [
            _retired(k, now, retention) if k.info.alg in algorithms and k.info.state == "active" else k
            for k in pruned.keys
        ]
        return KeyRing(keys, pruned.hints).provision(algorithms, now)

    def prune(self, now: int, retention: Retention) -> "KeyRing":
        """
        Withdraw from the JWKS the retired keys whose last token has
        expired, each kept as a hint key until C{retention.hints} after its
        retirement, and drop expired hint keys; C{self} if none.
        """
        retirements = [(k, _retirement(k)) for k in self.keys]
        kept = [k for k, times in retirements if times is None or times[1] > now]
        hints = [hint for hint in self.hints if hint.expires_at > now] + [
            HintKey.of(k, times[0] + retention.hints)
            for k, times in retirements
            if times is not None and times[1] <= now < times[0] + retention.hints
        ]
        if len(kept) == len(self.keys) and len(hints) == len(self.hints):
            return self
        return KeyRing(kept, hints)

    def due(self, now: int, every: int) -> tuple[str, ...]:
        """The algorithms whose active key has been signing for C{every} seconds."""
        return tuple(
            alg for alg, key in self._active.items()
            if key.info.activated_at is not None and key.info.activated_at + every <= now
        )

    def adopt(self, jwk: JWK, now: int) -> "KeyRing":
        """
        Take in a key an operator supplied: active when its algorithm has no
        active key, else next. Returns C{self} for a key already held.
        """
        alg = algorithm_of(jwk)
        if not jwk.has_private:
            raise InvalidKeys("has no private part")
        _labelled(jwk, alg)
        if jwk["kid"] in self:
            return self
        if alg in self._active:
            info = KeyInfo(jwk["kid"], alg, "next", now)
        else:
            info = KeyInfo(jwk["kid"], alg, "active", now, activated_at=now)
        return KeyRing(self.keys + (RingKey(jwk, info),), self.hints)

    def sign(self, claims: dict, alg: str, typ: str) -> str:
        """
        A compact JWS of C{claims} by the active key of C{alg}.

        The signature is jwcrypto's (its algorithm and key); the compact form
        around it is assembled here with the protected header encoded once
        per key and type, because jwcrypto's JWT and JWS objects cost more
        than the RSA signature itself on every token (measured in bench/).
        """
        signer = self._signers.get((alg, typ))
        if signer is None:
            key = self._active.get(alg)
            if key is None:
                raise ValueError(f"no active {alg} signing key")
            header = compact({"alg": alg, "kid": key.info.kid, "typ": typ})
            signer = self._signers[(alg, typ)] = (_b64(header) + b".", JWA.signing_alg(alg), key.jwk)
        prefix, algorithm, jwk = signer
        signing_input = prefix + _b64(compact(claims))
        return (signing_input + b"." + _b64(algorithm.sign(jwk, signing_input))).decode("ascii")

    def to_jwks(self) -> dict:
        """
        The private, persisted form: a JWK set whose keys carry their
        metadata, and the hint keys in a member of their own that JWK-set
        readers ignore (RFC 7517 section 5).
        """
        return {
            "keys": [
                key.jwk.export_private(as_dict=True) | {META: key.metadata()}
                for key in self.keys
            ],
            HINTS: [hint.to_entry() for hint in self.hints],
        }

    @classmethod
    def from_jwks(cls, document) -> "KeyRing":
        """The inverse of L{to_jwks}; L{InvalidKeys} for anything else."""
        entries = _entries(document)
        keys = []
        for index, entry in enumerate(entries):
            where = f"key {index}"
            if not isinstance(entry, dict) or not isinstance(entry.get(META), dict):
                raise InvalidKeys(f"{where}: not a JWK with its {META!r} metadata")
            members = {name: value for name, value in entry.items() if name != META}
            try:
                jwk = JWK(**members)
            except (JWException, ValueError, TypeError, KeyError) as e:
                raise InvalidKeys(f"{where}: not a valid JWK ({_one_line(e)})") from None
            keys.append(RingKey.restore(jwk, entry[META], where))
        return cls(keys, _hints(document, HINTS))

    def to_index(self) -> dict:
        """
        The public metadata of every key, and the hint keys, for storages
        keeping the private keys elsewhere.
        """
        return {
            "keys": [{"kid": k.info.kid, "alg": k.info.alg} | k.metadata() for k in self.keys],
            "hint_keys": [hint.to_entry() for hint in self.hints],
        }

    @classmethod
    def from_index(cls, document, load: Callable[[str], JWK]) -> "KeyRing":
        """
        The inverse of L{to_index}, with C{load(kid)} giving each private key
        (or raising L{InvalidKeys}).
        """
        keys = []
        for index, entry in enumerate(_entries(document)):
            if not isinstance(entry, dict) or not isinstance(entry.get("kid"), str):
                raise InvalidKeys(f"entry {index}: needs a kid")
            keys.append(RingKey.restore(load(entry["kid"]), entry, f"key {entry['kid']}"))
        return cls(keys, _hints(document, "hint_keys"))


def _activated(key: RingKey, now: int) -> RingKey:
    return evolve(key, info=evolve(key.info, state="active", activated_at=now))


def _hints(document: dict, member: str) -> list[HintKey]:
    """The hint keys listed in C{document}'s C{member}: none when it is absent, as before they existed."""
    entries = document.get(member, [])
    if not isinstance(entries, list):
        raise InvalidKeys(f'"{member}" must be an array')
    return [HintKey.from_entry(entry, f"hint key {index}") for index, entry in enumerate(entries)]


def _entries(document) -> list:
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise InvalidKeys('expected a JSON object with a "keys" array')
    return document["keys"]
