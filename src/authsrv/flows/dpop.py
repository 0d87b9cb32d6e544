"""
DPoP proofs at the token endpoint and at UserInfo (RFC 9449): the checks of
L{authsrv.protocol.dpop} and the one store step that makes each proof
single-use across every instance. Only a request that carries a proof, or
presents a DPoP-bound token, reaches here: bearer traffic pays nothing.
"""

from __future__ import annotations

from authsrv.flows.server_keys import ServerKeys
from authsrv.protocol.dpop import DpopPolicy, Proof, check_proof
from authsrv.protocol.errors import InvalidDpopProof

NONCE_KEY = "dpop-nonce"
"""The server secret nonces derive from: one per store, so a fleet agrees on them."""


class DpopVerifier:
    """C{store} answers C{first_use} and C{server_key}; C{policy} is the C{[dpop]} configuration."""

    def __init__(self, *, store, policy: DpopPolicy):
        self._store = store
        self.policy = policy
        self._keys = ServerKeys(store)

    async def _secret(self) -> bytes | None:
        return await self._keys.get(NONCE_KEY) if self.policy.use_nonce else None

    async def verify(
        self, headers: list[bytes], *, method: str, url: str, now: int, access_token: str | None = None,
    ) -> Proof:
        """
        The proof of a request's C{DPoP} header lines, checked against the
        endpoint's public C{url} and used up; L{InvalidDpopProof} (or
        L{authsrv.protocol.errors.UseDpopNonce}) otherwise.
        """
        if len(headers) != 1:
            raise InvalidDpopProof("send exactly one DPoP header")
        try:
            compact = headers[0].decode("ascii")
        except UnicodeDecodeError:
            raise InvalidDpopProof("the DPoP header must hold one proof JWT in compact serialisation") from None
        proof = check_proof(
            compact, method=method, url=url, now=now, policy=self.policy,
            nonce_secret=await self._secret(), access_token=access_token,
        )
        if not await self._store.first_use(proof.replay_key, proof.expires_at, now):
            raise InvalidDpopProof("this DPoP proof was used already; make a new proof for every request")
        return proof
