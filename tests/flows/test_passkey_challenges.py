"""
Passkey challenges (authsrv.flows.passkeys): showing one stores nothing; an
answer's challenge counts only when this service issued it for that very
ceremony (the interaction, or the user registering), before its end, and
only once, on any instance of the same store. Checked through
Passkeys.authenticate with a credential the store does not know: a
challenge that passes reaches the credential check ("unknown passkey"), one
that fails is refused before it.
"""

from __future__ import annotations

import base64
import json

import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults

from authsrv.flows.passkeys import CHALLENGE_TTL, Passkeys
from authsrv.testing.memory import MemoryStore, MemoryTables

NOW = 1_900_000_000
ORIGIN = "https://id.example.test"
UNKNOWN = "unknown passkey"
NO_CHALLENGE = "the challenge was not issued for this sign-in, or expired, or was used"


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def answer(options_json: str) -> str:
    """A browser's answer naming the options' challenge, from a credential the store does not know."""
    challenge = json.loads(options_json)["challenge"]
    client_data = json.dumps({"type": "webauthn.get", "challenge": challenge, "origin": ORIGIN}).encode()
    return json.dumps({"id": "cred-x", "rawId": "cred-x", "type": "public-key",
                       "response": {"clientDataJSON": b64(client_data), "authenticatorData": "", "signature": ""}})


def tampered(credential_json: str, change) -> str:
    credential = json.loads(credential_json)
    client_data = json.loads(base64.urlsafe_b64decode(credential["response"]["clientDataJSON"] + "=="))
    raw = bytearray(base64.urlsafe_b64decode(client_data["challenge"] + "=="))
    change(raw)
    client_data["challenge"] = b64(bytes(raw))
    credential["response"]["clientDataJSON"] = b64(json.dumps(client_data).encode())
    return json.dumps(credential)


def passkeys(store) -> Passkeys:
    return Passkeys(store=store, public_url=ORIGIN, rp_name="Example")


async def reason(keys: Passkeys, interaction: str, credential: str, audit, now: int = NOW) -> str:
    audit.clear()
    await keys.authenticate(interaction, credential, "192.0.2.1", now)
    [refused] = audit.of("passkey.refused")
    return refused["reason"]


@pytest_twisted.ensureDeferred
async def test_showing_a_challenge_stores_nothing(audit):
    store = MemoryStore()
    keys = passkeys(store)
    await keys.sign_in_options("i-1", NOW)
    await keys.registration_options("sub-1", "alice", "Alice", NOW)
    assert store.tables.dpop_proofs == {}
    assert set(store.tables.server_keys) == {"passkey-challenge"}


@pytest_twisted.ensureDeferred
async def test_a_challenge_counts_once_for_its_own_interaction_before_its_end(audit):
    keys = passkeys(MemoryStore())
    first = answer(await keys.sign_in_options("i-1", NOW))
    assert await reason(keys, "i-2", first, audit) == NO_CHALLENGE
    assert await reason(keys, "i-1", first, audit, NOW + CHALLENGE_TTL) == NO_CHALLENGE
    assert await reason(keys, "i-1", first, audit, NOW + CHALLENGE_TTL - 1) == UNKNOWN
    assert await reason(keys, "i-1", first, audit) == NO_CHALLENGE, "used up"

    registration = answer(await keys.registration_options("sub-1", "alice", "Alice", NOW))
    assert await reason(keys, "i-1", registration, audit) == NO_CHALLENGE, "issued for another ceremony"


@pytest_twisted.ensureDeferred
async def test_a_made_up_or_altered_challenge_is_refused_without_a_write(audit):
    store = MemoryStore()
    keys = passkeys(store)
    genuine = answer(await keys.sign_in_options("i-1", NOW))

    def later_end(raw):
        raw[16:24] = (NOW + 10 * CHALLENGE_TTL).to_bytes(8, "big")

    def flipped_mac(raw):
        raw[-1] ^= 1

    for forged in (tampered(genuine, later_end), tampered(genuine, flipped_mac), tampered(genuine, lambda raw: raw.pop()),
                   answer(json.dumps({"challenge": b64(b"\0" * 40)}))):
        assert await reason(keys, "i-1", forged, audit) == NO_CHALLENGE
    assert store.tables.dpop_proofs == {}
    assert await reason(keys, "i-1", genuine, audit) == UNKNOWN


@pytest_twisted.ensureDeferred
async def test_of_racing_answers_on_two_instances_one_counts(audit):
    tables = MemoryTables()
    first, second = passkeys(MemoryStore(tables)), passkeys(MemoryStore(tables))
    credential = answer(await first.sign_in_options("i-1", NOW))
    audit.clear()
    await gatherResults([Deferred.fromCoroutine(keys.authenticate("i-1", credential, "192.0.2.1", NOW))
                         for keys in (first, second)])
    assert sorted(e["reason"] for e in audit.of("passkey.refused")) == [NO_CHALLENGE, UNKNOWN]
