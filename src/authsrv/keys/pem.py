"""
Signing keys as PKCS#8 PEM files in a folder, one C{<kid>.pem} per key, with
C{index.json} recording each key's alg, state and times. A PEM file an
operator drops into the folder is adopted: active when its algorithm has no
active key, else next.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from jwcrypto.common import JWException
from jwcrypto.jwk import JWK

from authsrv.configsection import ConfigError
from authsrv.keys.filestore import (
    FileKeystore,
    file_keystore,
    locked_folder,
    read_private,
    sync_folder,
    write_private,
)
from authsrv.keys.ring import InvalidKeys, KeyRing

INDEX = "index.json"


def from_config(section, context) -> FileKeystore | None:
    """
    Keys: C{directory} (default C{keys}), C{algorithms} (default
    C{["RS256"]}), C{rotate_every} (a duration; no scheduled rotation when
    absent).
    """
    return file_keystore(section, context, "directory", "keys", PemFolder)


class PemFolder:
    """The storage of a L{FileKeystore}: a folder of 0600 PEM files and their index."""

    def __init__(self, directory: Path, key: str):
        self.directory = directory
        self._key = key
        self._adopted: dict[str, Path] = {}

    def _error(self, problem: str) -> ConfigError:
        return ConfigError(self._key, problem)

    def locked(self):
        return locked_folder(self.directory)

    def signature(self):
        """The index's and PEM files' names, inodes, sizes and times; None while they change."""
        try:
            return sorted(
                (entry.name, status.st_ino, status.st_size, status.st_mtime_ns)
                for entry in os.scandir(self.directory)
                if entry.name == INDEX or entry.name.endswith(".pem")
                for status in [entry.stat()]
            )
        except FileNotFoundError:
            return None

    def _pem(self, path: Path) -> JWK:
        try:
            return JWK.from_pem(read_private(path, self._key))
        except (JWException, ValueError, TypeError) as e:
            reason = " ".join(str(e).split())
            raise self._error(f"{path} is not an unencrypted PEM private key ({reason})") from None

    def _load_kid(self, kid: str) -> JWK:
        path = self.directory / f"{kid}.pem"
        if not path.exists():
            raise InvalidKeys(f"{path.name} is missing")
        return self._pem(path)

    def load(self, now: int, missing_ok: bool) -> tuple[KeyRing, bool]:
        index = self.directory / INDEX
        try:
            if missing_ok and not index.exists():
                ring, unsaved = KeyRing(()), True
            else:
                document = json.loads(index.read_bytes())
                ring, unsaved = KeyRing.from_index(document, self._load_kid), False
        except OSError as e:
            raise self._error(f"cannot read {index}: {e.strerror}") from None
        except (ValueError, RecursionError) as e:
            problem = e if isinstance(e, InvalidKeys) else f"not JSON ({' '.join(str(e).split())})"
            raise self._error(f"{index} is not a valid key index: {problem}") from None
        self._adopted = {}
        for path in sorted(self.directory.glob("*.pem")):
            if path.stem in ring:
                continue
            jwk = self._pem(path)
            try:
                adopted = ring.adopt(jwk, now)
            except InvalidKeys as e:
                raise self._error(f"cannot adopt {path}: {e}") from None
            if adopted is not ring:
                self._adopted[jwk["kid"]] = path
            ring = adopted
        return ring, unsaved or bool(self._adopted)

    def save(self, ring: KeyRing, stored: KeyRing) -> None:
        """
        Write new keys' files before the index that names them, and remove
        dropped keys' files after, so a reader never meets a missing key.
        """
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for key in ring.keys:
            path = self.directory / f"{key.info.kid}.pem"
            if key.info.kid in self._adopted:
                os.replace(self._adopted[key.info.kid], path)
            elif not path.exists():
                write_private(path, key.jwk.export_to_pem(private_key=True, password=None))
        self._adopted = {}
        write_private(self.directory / INDEX, json.dumps(ring.to_index(), indent=1).encode())
        for key in stored.keys:
            if key.info.kid not in ring:
                (self.directory / f"{key.info.kid}.pem").unlink(missing_ok=True)
        sync_folder(self.directory)
