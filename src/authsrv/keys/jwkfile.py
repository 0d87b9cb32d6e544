"""
The default keystore: one JSON file holding the private JWK set with each
key's state and times, generated on first start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from authsrv.configsection import ConfigError
from authsrv.keys.filestore import (
    FileKeystore,
    file_keystore,
    locked_folder,
    read_private,
    write_private,
)
from authsrv.keys.ring import InvalidKeys, KeyRing


def from_config(section, context) -> FileKeystore | None:
    """
    Keys: C{path} (default C{keys.jwks.json}), C{algorithms} (default
    C{["RS256"]}), C{rotate_every} (a duration; no scheduled rotation when
    absent).
    """
    return file_keystore(section, context, "path", "keys.jwks.json", JwkFile)


class JwkFile:
    """The storage of a L{FileKeystore}: one 0600 JWK-set file, replaced atomically."""

    def __init__(self, path: Path, key: str):
        self.path = path
        self._key = key

    def locked(self):
        return locked_folder(self.path.parent)

    def signature(self):
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return None
        return status.st_ino, status.st_size, status.st_mtime_ns

    def load(self, now: int, missing_ok: bool) -> tuple[KeyRing, bool]:
        if missing_ok and not self.path.exists():
            return KeyRing(()), True
        data = read_private(self.path, self._key)
        try:
            return KeyRing.from_jwks(json.loads(data)), False
        except (ValueError, RecursionError) as e:
            problem = e if isinstance(e, InvalidKeys) else f"not JSON ({' '.join(str(e).split())})"
            raise ConfigError(
                self._key, f"{self.path} is not a valid key file: {problem}"
            ) from None

    def save(self, ring: KeyRing, stored: KeyRing) -> None:
        write_private(self.path, json.dumps(ring.to_jwks(), indent=1).encode())
