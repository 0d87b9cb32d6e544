"""
Second factors: TOTP (RFC 6238) and recovery codes, kept in authsrv's own
store under the user's stable id, so any identity backend will do, a
read-only directory included.

A TOTP secret is stored sealed (AES-256-GCM with a server key, the user's id
as associated data, so a row copied to another user does not open); a code
is accepted for the current time step or one either side, and each step
only once: the store's compare-and-set on the last accepted step decides
between racing submissions. Recovery codes are random, shown once, stored
as keyed hashes and each used up by one atomic delete. Wrong codes count in
the store's login throttle like wrong passwords, under an account key of
their own, so a correct password does not clear them.

An enrolment in progress is stateless: the new secret and recovery codes
travel sealed in the page's form, so nothing is stored until the user
proves with a first code that their authenticator has the secret; once
confirmed, that form is worth nothing (its secret is the stored one).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets

import pyotp
from attrs import evolve, frozen
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from authsrv import events
from authsrv.flows.login import KNOWN_DEVICE_TTL, Throttled
from authsrv.flows.passkeys import MAX_PASSKEYS, PASSKEY_METHODS
from authsrv.flows.server_keys import ServerKeys
from authsrv.flows.together import together
from authsrv.protocol.forwarded import address_key
from authsrv.protocol.oidc import mfa_requested
from authsrv.records import (
    ACR_MFA,
    ENROL_STAGE,
    MFA_STAGE,
    TOTP_FACTOR,
    AuthorizationRequest,
    BrowserSession,
    Client,
    ThrottlePolicy,
)
from authsrv.tokens import token_hash

MFA_OFF, MFA_OPTIONAL, MFA_REQUIRED = "off", "optional", "required"
MFA_CHOICES = (MFA_OFF, MFA_OPTIONAL, MFA_REQUIRED)
TOTP_KEY = "totp-secrets"
"""The server key that seals TOTP secrets and enrolments in progress."""
RECOVERY_KEY = "recovery-codes"
"""The server key recovery codes are hashed with."""
TOTP_INTERVAL = 30
TOTP_DIGITS = 6
DRIFT_STEPS = 1
"""Codes of this many time steps either side of now are accepted too (a clock off by up to 30 s)."""
RECOVERY_CODES = 10
RECOVERY_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
RECOVERY_LENGTH = 10
"""Ten characters of 31: about 50 bits, so guessing one is hopeless under the throttle."""
ENROLMENT_TTL = 1800
SHOWN_TTL = 300
"""How long new recovery codes wait, sealed in the browser, for the page that shows them once."""
THROTTLE_PREFIX = "mfa:"
NONCE_BYTES = 12


@frozen
class MfaPolicy:
    """
    C{[mfa]}: whether second factors are off, offered, or required of
    everyone; the grace to enrol; how recent a sign-in must be to change
    factors; how many passkeys a user keeps.
    """

    required: str = MFA_OPTIONAL
    enrol_grace: int = 7 * 86400
    recent_sign_in: int = 600
    """
    Seconds after its sign-in that a session may still change the user's
    factors (a sudo mode), so a stolen session cookie alone enrols none.
    """
    max_passkeys: int = MAX_PASSKEYS

    @property
    def enabled(self) -> bool:
        return self.required != MFA_OFF


@frozen
class Held:
    """The second factors a user has: an authenticator app (C{totp}), passkeys."""

    totp: bool
    passkeys: bool


@frozen
class Enrolment:
    """A new TOTP secret and recovery codes to show, and the sealed form of both that the page posts back."""

    secret: str
    otpauth_uri: str
    recovery_codes: tuple[str, ...]
    sealed: str


@frozen
class Accepted:
    method: str
    """C{"totp"} or C{"recovery"}."""


@frozen
class CodeRefused:
    """A wrong, replayed or unknown code: one answer for all."""


def _seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def _open(key: bytes, sealed: bytes, aad: bytes) -> bytes | None:
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
    except (InvalidTag, ValueError):
        return None


def _shown_aad(sub: str) -> bytes:
    return b"authsrv new recovery codes\x00" + sub.encode()


def _totp_aad(sub: str) -> bytes:
    return b"authsrv totp secret\x00" + sub.encode()


def _enrolment_aad(sub: str) -> bytes:
    return b"authsrv totp enrolment\x00" + sub.encode()


def normalised(code: str) -> str:
    """A code as typed, without the spaces and dashes people add, lower case."""
    return "".join(code.split()).replace("-", "").lower()


def new_recovery_code() -> str:
    code = "".join(secrets.choice(RECOVERY_ALPHABET) for _ in range(RECOVERY_LENGTH))
    return f"{code[:5]}-{code[5:]}"


def matching_step(secret: str, code: str, now: int) -> int | None:
    """The time step within the window whose code C{code} is (constant-time comparisons), or None."""
    if len(code) != TOTP_DIGITS or not code.isdigit():
        return None
    totp = pyotp.TOTP(secret, digits=TOTP_DIGITS, interval=TOTP_INTERVAL)
    current = now // TOTP_INTERVAL
    found = None
    for step in range(current - DRIFT_STEPS, current + DRIFT_STEPS + 1):
        if hmac.compare_digest(totp.at(step * TOTP_INTERVAL).encode(), code.encode()):
            found = step
    return found


FAILURES_PER_ACCOUNT = 10
FAILURE_WINDOW = 3600


def second_factor_throttle(throttle: ThrottlePolicy) -> ThrottlePolicy:
    """
    The login throttle held tighter for codes: a six-digit code has three
    live values in a million (one step of drift each way), so the password
    limit of a hundred failures every fifteen minutes let one who holds the
    password through in weeks. Ten an hour from everywhere makes that years;
    the user's own known browser is never held back (L{ThrottlePolicy}).
    """
    return evolve(
        throttle, failures_per_account=min(throttle.failures_per_account, FAILURES_PER_ACCOUNT),
        window=max(throttle.window, FAILURE_WINDOW),
    )


class SecondFactors:
    """
    C{store} plays L{authsrv.interfaces.IFactorStore},
    L{authsrv.interfaces.IServerSecrets} and the login throttle (held
    tighter, L{second_factor_throttle}); C{issuer_label} names this service
    in authenticator apps.
    """

    def __init__(self, *, store, policy: MfaPolicy, throttle: ThrottlePolicy, issuer_label: str):
        self._store = store
        self.policy = policy
        self._throttle = second_factor_throttle(throttle)
        self._issuer_label = issuer_label
        self._keys = ServerKeys(store)

    async def _recovery_hash(self, sub: str, code: str) -> str:
        key = await self._keys.get(RECOVERY_KEY)
        return hmac.new(key, f"{sub}\x00{normalised(code)}".encode(), hashlib.sha256).hexdigest()

    async def has_totp(self, sub: str) -> bool:
        """Whether the user has an authenticator to give a code of (recovery codes alone are not one)."""
        return await self._store.get_totp(sub) is not None

    async def factors(self, sub: str):
        return await self._store.list_factors(sub)

    async def held(self, sub: str) -> Held:
        """Which second factors the user has, both read in one round trip to the store."""
        totp, passkeys = await together([self._store.get_totp(sub), self._store.list_passkeys(sub)])
        return Held(totp=totp is not None, passkeys=bool(passkeys))

    def recent(self, session: BrowserSession, now: int) -> bool:
        """Whether the session signed in within C{[mfa] recent_sign_in}, as changing factors needs."""
        return now - session.auth_time <= self.policy.recent_sign_in

    async def has_factor(self, sub: str) -> bool:
        """Whether the user has a second factor: an authenticator app or a passkey."""
        held = await self.held(sub)
        return held.totp or held.passkeys

    async def demand(self, client: Client, request: AuthorizationRequest, sub: str, acr: str | None,
                     now: int, amr: tuple[str, ...] = (), held: Held | None = None) -> str | None:
        """
        The stage a sign-in must pass before it completes, for a user who
        signed in at C{acr} (None: only the first factor just now) by
        C{amr}: none once a second factor was given or when factors are
        off; the factor (L{MFA_STAGE}) when the user has one other than
        the passkey they signed in with; enrolment (L{ENROL_STAGE}) when
        the policy, the client or the request (its acr) wants one of a user
        without any, the grace period counted from the first such demand.
        C{held} is what L{held} read already, if the caller read it.
        """
        if not self.policy.enabled or acr == ACR_MFA:
            return None
        held = held or await self.held(sub)
        if held.totp:
            return MFA_STAGE
        if held.passkeys:
            return None if any(method in PASSKEY_METHODS for method in amr) else MFA_STAGE
        if not (self.policy.required == MFA_REQUIRED or client.require_mfa or mfa_requested(request.acr_values)):
            return None
        await self._store.mfa_demanded(sub, now)
        return ENROL_STAGE

    async def grace_until(self, sub: str, now: int) -> int | None:
        """Until when the user may still put off enrolling (counted from the first demand), or None."""
        until = await self._store.mfa_demanded(sub, now) + self.policy.enrol_grace
        return until if now < until else None

    async def verify(self, sub: str, code: str, address: str, device: str | None, now: int):
        """
        A second factor given at sign-in: a TOTP code or a recovery code.
        Fires with L{Accepted}, L{CodeRefused} or
        L{authsrv.flows.login.Throttled}; every attempt is counted first.
        """
        store, account, key = self._store, THROTTLE_PREFIX + sub, address_key(address)
        device_hash = token_hash(device) if device else None
        decision = await store.attempt(account, key, device_hash, self._throttle, now)
        if decision.wait is not None:
            events.mfa_failed(sub=sub, address=address, reason=f"throttled for {decision.wait}s")
            return Throttled(decision.wait)
        method = await self._check(sub, normalised(code), now)
        if method is None:
            events.mfa_failed(sub=sub, address=address, reason="wrong or replayed code")
            return CodeRefused()
        await store.succeeded(account, key, now)
        if device_hash is not None:
            await store.remember_device(account, device_hash, now + KNOWN_DEVICE_TTL)
        events.mfa_succeeded(sub=sub, method=method, address=address)
        return Accepted(method)

    async def _check(self, sub: str, code: str, now: int) -> str | None:
        if len(code) == TOTP_DIGITS and code.isdigit():
            factor = await self._store.get_totp(sub)
            if factor is None:
                return None
            secret = _open(await self._keys.get(TOTP_KEY), factor.secret_enc, _totp_aad(sub))
            step = None if secret is None else matching_step(secret.decode(), code, now)
            if step is not None and await self._store.use_totp_step(sub, step):
                return "totp"
            return None
        if await self._store.use_recovery_code(sub, await self._recovery_hash(sub, code)):
            return "recovery"
        return None

    async def new_enrolment(self, sub: str, login: str, now: int) -> Enrolment:
        """A fresh secret and recovery codes, sealed for this user until L{ENROLMENT_TTL} from now."""
        secret = pyotp.random_base32()
        codes = tuple(new_recovery_code() for _ in range(RECOVERY_CODES))
        payload = json.dumps({"secret": secret, "codes": codes, "expires_at": now + ENROLMENT_TTL}).encode()
        sealed = _seal(await self._keys.get(TOTP_KEY), payload, _enrolment_aad(sub))
        uri = pyotp.TOTP(secret, digits=TOTP_DIGITS, interval=TOTP_INTERVAL).provisioning_uri(
            name=login, issuer_name=self._issuer_label
        )
        return Enrolment(secret, uri, codes, base64.urlsafe_b64encode(sealed).decode())

    async def _opened(self, sub: str, sealed: str | None) -> dict | None:
        """
        The secret, codes and expiry of a sealed enrolment made for this
        user and not confirmed yet, or None. A confirmed one's form, posted
        again, would show the live secret and recovery codes once more, or
        bring back the codes used since.
        """
        if not sealed:
            return None
        try:
            raw = base64.urlsafe_b64decode(sealed.encode())
        except ValueError:
            return None
        key = await self._keys.get(TOTP_KEY)
        payload = _open(key, raw, _enrolment_aad(sub))
        if payload is None:
            return None
        data = json.loads(payload)
        factor = await self._store.get_totp(sub)
        if factor is not None and _open(key, factor.secret_enc, _totp_aad(sub)) == data["secret"].encode():
            return None
        return data

    async def open_enrolment(self, sub: str, sealed: str | None, login: str, now: int) -> Enrolment | None:
        """The unexpired enrolment a page showed this user, to show it again after a wrong code."""
        data = await self._opened(sub, sealed)
        if data is None or data["expires_at"] <= now:
            return None
        uri = pyotp.TOTP(data["secret"]).provisioning_uri(name=login, issuer_name=self._issuer_label)
        return Enrolment(data["secret"], uri, tuple(data["codes"]), sealed or "")

    async def confirm(self, sub: str, sealed: str | None, code: str, now: int, address: str) -> bool:
        """
        Enrol the sealed secret and recovery codes when C{code} is the
        authenticator's current one (that step then counts as used); the
        earlier factor, if any, is replaced. C{address}: the browser's, for
        the audit event.
        """
        data = await self._opened(sub, sealed)
        if data is None or data["expires_at"] <= now:
            return False
        step = matching_step(data["secret"], normalised(code), now)
        if step is None:
            return False
        secret_enc = _seal(await self._keys.get(TOTP_KEY), data["secret"].encode(), _totp_aad(sub))
        await self._store.enrol_totp(sub, secret_enc, step, now)
        await self._store.replace_recovery_codes(sub, [await self._recovery_hash(sub, c) for c in data["codes"]], now)
        events.mfa_enrolled(sub=sub, kind=TOTP_FACTOR, address=address)
        return True

    async def replace_recovery_codes(self, sub: str, now: int, address: str) -> str:
        """
        A new set of recovery codes, replacing the old one; the codes are
        returned once, sealed for this user until L{SHOWN_TTL} from now
        (L{open_new_recovery_codes}), and never stored.
        """
        codes = tuple(new_recovery_code() for _ in range(RECOVERY_CODES))
        await self._store.replace_recovery_codes(sub, [await self._recovery_hash(sub, c) for c in codes], now)
        events.recovery_codes_replaced(sub=sub, address=address)
        payload = json.dumps({"codes": codes, "expires_at": now + SHOWN_TTL}).encode()
        return base64.urlsafe_b64encode(_seal(await self._keys.get(TOTP_KEY), payload, _shown_aad(sub))).decode()

    async def open_new_recovery_codes(self, sub: str, sealed: str | None, now: int) -> tuple[str, ...]:
        """The codes L{replace_recovery_codes} sealed for this user, while fresh; none for anything else."""
        try:
            raw = base64.urlsafe_b64decode((sealed or "").encode())
        except ValueError:
            return ()
        payload = _open(await self._keys.get(TOTP_KEY), raw, _shown_aad(sub)) if raw else None
        if payload is None:
            return ()
        data = json.loads(payload)
        return tuple(data["codes"]) if data["expires_at"] > now else ()


async def reset_factors(store, sub: str, *, actor: str) -> bool:
    """
    An operator's reset: the user's factors go, and their grace period
    starts again at the next demand; audited. False when there were none.
    """
    removed = await store.reset_factors(sub)
    events.factors_reset(sub=sub, actor=actor)
    return removed
