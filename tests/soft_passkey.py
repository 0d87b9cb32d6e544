"""
A software WebAuthn authenticator for flow tests: one ES256 credential whose
registration ("none" attestation) and assertions it builds byte by byte, so
a test may set any flag or counter a real authenticator would not.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

UP, UV, BE, BS, AT = 0x01, 0x04, 0x08, 0x10, 0x40


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class SoftPasskey:
    """A discoverable credential of user C{user_handle} at relying party C{rp_id}, used from C{origin}."""

    def __init__(self, rp_id: str, origin: str, user_handle: bytes):
        self.rp_id, self.origin, self.user_handle = rp_id, origin, user_handle
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.raw_id = os.urandom(16)
        self.id = b64(self.raw_id)
        self.count = 0

    def cose_key(self) -> bytes:
        numbers = self.key.public_key().public_numbers()
        return cbor2.dumps({1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")})

    def _client_data(self, kind: str, options_json: str) -> bytes:
        challenge = json.loads(options_json)["challenge"]
        return json.dumps({"type": kind, "challenge": challenge, "origin": self.origin}).encode()

    def _rp_hash(self) -> bytes:
        return hashlib.sha256(self.rp_id.encode()).digest()

    def create(self, options_json: str, flags: int = UP | UV | AT, cose_key: bytes | None = None) -> str:
        """The browser's answer to creation options, as the page posts it."""
        client_data = self._client_data("webauthn.create", options_json)
        attested = b"\x00" * 16 + len(self.raw_id).to_bytes(2, "big") + self.raw_id + (cose_key or self.cose_key())
        auth_data = self._rp_hash() + bytes([flags]) + self.count.to_bytes(4, "big") + attested
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return json.dumps({"id": self.id, "rawId": self.id, "type": "public-key", "response": {
            "clientDataJSON": b64(client_data), "attestationObject": b64(attestation), "transports": ["internal"]}})

    def get(self, options_json: str, flags: int = UP | UV, count: int | None = None) -> str:
        """The browser's answer to request options, signed; the counter goes up unless C{count} names one."""
        if count is None:
            self.count += 1
            count = self.count
        client_data = self._client_data("webauthn.get", options_json)
        auth_data = self._rp_hash() + bytes([flags]) + count.to_bytes(4, "big")
        signature = self.key.sign(auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256()))
        return json.dumps({"id": self.id, "rawId": self.id, "type": "public-key", "response": {
            "clientDataJSON": b64(client_data), "authenticatorData": b64(auth_data), "signature": b64(signature),
            "userHandle": b64(self.user_handle)}})
