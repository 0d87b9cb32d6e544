"""The signing keys: list them with their states, and rotate."""

from __future__ import annotations

from authsrv.operations.errors import Conflict
from authsrv.records import KeyInfo, Rotation

JWKS_MAX_AGE = 600
"""
How long relying parties may cache the JWKS: a next key must have been
published at least this long before it is promoted and signs.
"""

ADOPTED = "another process had just rotated; this one adopted its keys: ask again to rotate once more"
"""Told whoever asked for a rotation that adopted another's instead of rotating."""


class KeyOperations:
    """Built with the keystore and the clock."""

    def __init__(self, *, keystore, clock):
        self._keystore = keystore
        self._clock = clock

    def keys(self) -> list[KeyInfo]:
        return list(self._keystore.keys())

    async def rotate(self, *, actor: str, force: bool = False) -> Rotation:
        """
        Promote each next key, retire the active one; refused while a next
        key is younger than L{JWKS_MAX_AGE} (relying parties may not have
        it yet) unless C{force}. Its C{rotated} is False when another process
        had just rotated and this one only adopted that (see L{ADOPTED}).
        """
        now = int(self._clock.seconds())
        for key in self._keystore.keys():
            age = now - key.created_at
            if key.state == "next" and age < JWKS_MAX_AGE and not force:
                raise Conflict(
                    f"the next {key.alg} key was published {age} s ago, and relying parties"
                    f" cache the JWKS for {JWKS_MAX_AGE} s: rotate in {JWKS_MAX_AGE - age} s,"
                    " or now with force (tokens it signs may fail to verify meanwhile)"
                )
        return await self._keystore.rotate(now, actor)
