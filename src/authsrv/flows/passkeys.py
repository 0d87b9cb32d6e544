"""
Passkeys (WebAuthn, with the C{webauthn} package): registering a signed-in
user's authenticators, and checking an assertion at sign-in, instead of a
password (a discoverable credential names its user) or as the second factor.

The relying party is the public URL: its host is the RP id, its origin (as
browsers write it: L{browser_origin}) the only one accepted. User
verification is required both ways, so a passkey alone proves possession and
the PIN or biometric behind it. Every ceremony has its own random challenge,
which carries its end and an HMAC, under a key of the store's, of both and
of the purpose it was issued for (a registration for one user, a sign-in for
one interaction): showing one stores nothing, so a login page is read
without a write. The answer's challenge is checked, then used up once in the
store, with the same single-use record DPoP proofs have: a replayed answer
finds it used. The sign counter must grow with each use; an assertion whose
counter did not (a cloned authenticator) is refused and audited. Whatever
the library finds wrong with an answer (any of its C{WebAuthnException}s,
such as backup flags no authenticator sets or a key it cannot read) refuses
it, never a server error. A credential that may be synced between devices
(backup-eligible) counts as a software key (RFC 8176 C{swk}), any other as a
hardware key (C{hwk}). A user keeps at most C{[mfa] max_passkeys}
(L{MAX_PASSKEYS} by default): every sign-in naming the user lists them all
to the browser.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import urlsplit

from attrs import frozen
from webauthn import (
    generate_authentication_options,
    generate_registration_options,
    options_to_json,
    verify_authentication_response,
    verify_registration_response,
)
from webauthn.helpers import base64url_to_bytes, bytes_to_base64url, parse_client_data_json
from webauthn.helpers.exceptions import InvalidAuthenticationResponse, InvalidJSONStructure, WebAuthnException
from webauthn.helpers.structs import (
    AuthenticatorSelectionCriteria,
    CredentialDeviceType,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from authsrv import events
from authsrv.flows.server_keys import ServerKeys
from authsrv.protocol import jsontext
from authsrv.records import Passkey
from authsrv.store.errors import AlreadyExists
from authsrv.tokens import token_hash

CHALLENGE_TTL = 300
"""How long a challenge waits for the browser's answer."""
CHALLENGE_KEY = "passkey-challenge"
"""The server secret challenges are signed with: one per store, so any instance checks another's."""
NONCE_SIZE, END_SIZE, MAC_SIZE = 16, 8, 16
"""A challenge's parts, in bytes: random, its end (seconds, big-endian), the truncated HMAC-SHA256."""
TIMEOUT_MS = CHALLENGE_TTL * 1000
HARDWARE_KEY, SOFTWARE_KEY = "hwk", "swk"
PASSKEY_METHODS = (HARDWARE_KEY, SOFTWARE_KEY)
MAX_PASSKEYS = 20
"""
The most passkeys one user keeps unless configured (C{[mfa] max_passkeys},
at most L{PASSKEYS_CEILING}): each is a row, and a sign-in naming the user
lists them all (C{allowCredentials}). Checked before the new one is
stored, not atomically: two additions at once may both pass, so the cap may
be passed by as many as raced, and then no more is added.
"""
PASSKEYS_CEILING = 100
"""The highest C{[mfa] max_passkeys}: a sign-in's options list every passkey, each id up to a few hundred bytes."""
MAX_CREDENTIAL_JSON = 16384
MAX_TRANSPORTS = 8
_TRANSPORT = re.compile(r"[a-z0-9-]{1,32}")


def browser_origin(url: str) -> str:
    """
    The origin of C{url} as a browser writes it in an answer's client data
    (the HTML serialization of RFC 6454): host in lower case, no port when
    it is the scheme's default, so that a public URL written
    C{https://Id.Example:443} still matches C{https://id.example}.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return f"{parts.scheme}://{host}" + ("" if port is None or port == default else f":{port}")


def transport_names(transports) -> tuple[str, ...]:
    """
    The transports a browser's answer lists, to keep with the passkey: at
    most L{MAX_TRANSPORTS} that look like names, so no other text a page
    posts is stored (a NUL character, which PostgreSQL refuses, included).
    """
    if not isinstance(transports, list):
        return ()
    return tuple(t for t in transports if isinstance(t, str) and _TRANSPORT.fullmatch(t))[:MAX_TRANSPORTS]


def registration_purpose(sub: str) -> str:
    return "register:" + sub


def sign_in_purpose(interaction_id: str) -> str:
    return "sign-in:" + interaction_id


def key_method(passkey: Passkey) -> str:
    """The RFC 8176 method a passkey gives: C{swk} when it may be synced, else C{hwk}."""
    return SOFTWARE_KEY if passkey.backup_eligible else HARDWARE_KEY


def fingerprint(credential_id: str) -> str:
    """A short name of a credential id for the audit log."""
    return token_hash(credential_id)[:8]


@frozen
class PasskeyAccepted:
    passkey: Passkey
    """The passkey as it is stored now (its new counter)."""

    @property
    def method(self) -> str:
        return key_method(self.passkey)


@frozen
class PasskeyRefused:
    """An answer that proves nothing: unknown credential, wrong challenge, bad signature, or a cloned key."""


@frozen
class TooManyPasskeys:
    """A new passkey refused because the user keeps L{Passkeys.limit} already."""


def _mac(key: bytes, purpose: str, nonce: bytes, end: bytes) -> bytes:
    return hmac.new(key, purpose.encode() + b"\0" + nonce + end, hashlib.sha256).digest()[:MAC_SIZE]


def _challenge_of(credential: dict) -> bytes | None:
    """The challenge the browser signed, read from the answer's client data."""
    try:
        client_data = parse_client_data_json(base64url_to_bytes(credential["response"]["clientDataJSON"]))
    except (KeyError, TypeError, ValueError, InvalidJSONStructure):
        return None
    return client_data.challenge


def _parsed(credential_json: str | None) -> dict | None:
    if not credential_json or len(credential_json) > MAX_CREDENTIAL_JSON:
        return None
    try:
        credential = jsontext.loads(credential_json)
    except ValueError:
        return None
    return credential if isinstance(credential, dict) and isinstance(credential.get("id"), str) else None


class Passkeys:
    """
    C{store} plays L{authsrv.interfaces.IFactorStore},
    L{authsrv.interfaces.IProofReplayStore} and
    L{authsrv.interfaces.IServerSecrets}; C{public_url} names the relying
    party.
    """

    def __init__(self, *, store, public_url: str, rp_name: str, limit: int = MAX_PASSKEYS):
        self._store = store
        self.limit = limit
        """The most passkeys a user keeps (C{[mfa] max_passkeys})."""
        self.rp_id = urlsplit(public_url).hostname or ""
        self.origin = browser_origin(public_url)
        self._rp_name = rp_name
        self._keys = ServerKeys(store)

    async def _challenge(self, purpose: str, now: int) -> bytes:
        """A new challenge for C{purpose}: random bytes, its end, and the MAC of those and the purpose."""
        nonce, end = secrets.token_bytes(NONCE_SIZE), (now + CHALLENGE_TTL).to_bytes(END_SIZE, "big")
        return nonce + end + _mac(await self._keys.get(CHALLENGE_KEY), purpose, nonce, end)

    async def _take(self, credential: dict, purpose: str, now: int) -> bytes | None:
        """The answer's challenge when this service issued it for C{purpose}, unexpired and unused; used up now."""
        challenge = _challenge_of(credential)
        if challenge is None or len(challenge) != NONCE_SIZE + END_SIZE + MAC_SIZE:
            return None
        nonce, end, mac = challenge[:NONCE_SIZE], challenge[NONCE_SIZE:-MAC_SIZE], challenge[-MAC_SIZE:]
        expires_at = int.from_bytes(end, "big")
        key = await self._keys.get(CHALLENGE_KEY)
        if expires_at <= now or not hmac.compare_digest(mac, _mac(key, purpose, nonce, end)):
            return None
        if not await self._store.first_use(token_hash("passkey:" + bytes_to_base64url(challenge)), expires_at, now):
            return None
        return challenge

    async def list(self, sub: str) -> list[Passkey]:
        return await self._store.list_passkeys(sub)

    async def registration_options(self, sub: str, login: str, display_name: str, now: int) -> str:
        """The JSON C{PublicKeyCredentialCreationOptions} of a new passkey for the user, as the page passes them."""
        existing = await self._store.list_passkeys(sub)
        options = generate_registration_options(
            rp_id=self.rp_id, rp_name=self._rp_name, user_id=sub.encode(), user_name=login,
            user_display_name=display_name, timeout=TIMEOUT_MS,
            authenticator_selection=AuthenticatorSelectionCriteria(
                resident_key=ResidentKeyRequirement.REQUIRED, require_resident_key=True,
                user_verification=UserVerificationRequirement.REQUIRED,
            ),
            exclude_credentials=[PublicKeyCredentialDescriptor(id=base64url_to_bytes(p.credential_id))
                                 for p in existing],
            challenge=await self._challenge(registration_purpose(sub), now),
        )
        return options_to_json(options)

    async def register(self, sub: str, credential_json: str | None, now: int,
                       address: str) -> Passkey | TooManyPasskeys | None:
        """
        Keep the new passkey the browser created for this user's challenge;
        None when the answer fails, L{TooManyPasskeys} when the user keeps
        L{limit} already (counted just before storing, to narrow the
        window two additions at once have). C{address}: the browser's, for
        the audit event.
        """
        credential = _parsed(credential_json)
        if credential is None:
            return None
        challenge = await self._take(credential, registration_purpose(sub), now)
        if challenge is None:
            return None
        try:
            verified = verify_registration_response(
                credential=credential, expected_challenge=challenge, expected_rp_id=self.rp_id,
                expected_origin=self.origin, require_user_verification=True,
            )
        except (WebAuthnException, ValueError, KeyError, TypeError):
            return None
        transports = credential.get("response", {}).get("transports")
        passkey = Passkey(
            credential_id=bytes_to_base64url(verified.credential_id), sub=sub,
            public_key=verified.credential_public_key, sign_count=verified.sign_count,
            backup_eligible=verified.credential_device_type == CredentialDeviceType.MULTI_DEVICE,
            backup_state=verified.credential_backed_up,
            transports=transport_names(transports), created_at=now,
        )
        if len(await self._store.list_passkeys(sub)) >= self.limit:
            return TooManyPasskeys()
        try:
            await self._store.add_passkey(passkey)
        except AlreadyExists:
            return None
        events.passkey_registered(sub=sub, credential=fingerprint(passkey.credential_id),
                                  synced=passkey.backup_eligible, address=address)
        return passkey

    async def remove(self, sub: str, credential_id: str, address: str) -> bool:
        removed = await self._store.remove_passkey(sub, credential_id)
        if removed:
            events.passkey_removed(sub=sub, credential=fingerprint(credential_id), address=address)
        return removed

    async def sign_in_options(self, interaction_id: str, now: int, sub: str | None = None) -> str:
        """
        The JSON C{PublicKeyCredentialRequestOptions} of a sign-in: any
        discoverable passkey of this site when no user is known yet, else
        one of C{sub}'s.
        """
        allowed = None
        if sub is not None:
            allowed = [PublicKeyCredentialDescriptor(id=base64url_to_bytes(p.credential_id))
                       for p in await self._store.list_passkeys(sub)]
        options = generate_authentication_options(
            rp_id=self.rp_id, timeout=TIMEOUT_MS, allow_credentials=allowed,
            user_verification=UserVerificationRequirement.REQUIRED,
            challenge=await self._challenge(sign_in_purpose(interaction_id), now),
        )
        return options_to_json(options)

    async def authenticate(self, interaction_id: str, credential_json: str | None, address: str, now: int,
                           sub: str | None = None) -> PasskeyAccepted | PasskeyRefused:
        """
        Check the browser's answer to the interaction's challenge: a
        registered passkey (of C{sub} when given) signed it with the user
        verified and a counter above the stored one. Refusals are audited.
        """
        credential = _parsed(credential_json)
        if credential is None:
            return PasskeyRefused()
        credential_id = credential["id"]
        passkey = await self._store.get_passkey(credential_id)

        def refused(reason: str) -> PasskeyRefused:
            events.passkey_refused(sub=passkey.sub if passkey else sub, credential=fingerprint(credential_id),
                                   address=address, reason=reason)
            return PasskeyRefused()

        challenge = await self._take(credential, sign_in_purpose(interaction_id), now)
        if challenge is None:
            return refused("the challenge was not issued for this sign-in, or expired, or was used")
        if passkey is None or (sub is not None and passkey.sub != sub):
            return refused("unknown passkey")
        handle = (credential.get("response") or {}).get("userHandle")
        if handle and handle != bytes_to_base64url(passkey.sub.encode()):
            return refused("the passkey names another user")
        try:
            verified = verify_authentication_response(
                credential=credential, expected_challenge=challenge, expected_rp_id=self.rp_id,
                expected_origin=self.origin, credential_public_key=passkey.public_key,
                credential_current_sign_count=passkey.sign_count, require_user_verification=True,
            )
        except InvalidAuthenticationResponse as e:
            if "sign count" in str(e):
                return refused(f"sign counter went back or stood still (cloned authenticator?): {e}")
            return refused(str(e))
        except WebAuthnException as e:
            return refused(str(e) or type(e).__name__)
        except (ValueError, KeyError, TypeError):
            return refused("malformed answer")
        if not await self._store.use_passkey(credential_id, verified.new_sign_count, verified.credential_backed_up,
                                             now):
            return refused("sign counter did not grow (cloned authenticator?)")
        events.passkey_succeeded(sub=passkey.sub, credential=fingerprint(credential_id), address=address)
        used = await self._store.get_passkey(credential_id)
        return PasskeyAccepted(used if used is not None else passkey)
