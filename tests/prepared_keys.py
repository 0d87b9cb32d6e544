"""
Test-only signing keys, made once per test session (once per worker under
pytest-xdist) and written into a test's own folder as a jwk-file keystore's
key file. Making an RSA key takes a tenth of a second or more, and most
tests start a keystore whose keys are not what they test; such a keystore
now loads this file instead of generating keys on first start.

Tests of key generation and rotation (tests/test_keys*.py) still generate.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

from authsrv.keys.filestore import write_private
from authsrv.keys.ring import KeyRing

SESSION_START = int(time.time())
"""When the keys written for real processes were made: they use the real clock."""


@functools.cache
def _key_file_text(algorithms: tuple[str, ...], now: int) -> bytes:
    return json.dumps(KeyRing(()).provision(algorithms, now).to_jwks(), indent=1).encode()


def write_key_file(path: Path, algorithms: tuple[str, ...] = ("RS256",), now: int = SESSION_START) -> Path:
    """
    At C{path}, the key file a jwk-file keystore for C{algorithms} writes on
    its first start at C{now} (an active and a next key per algorithm).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, _key_file_text(tuple(algorithms), now))
    return path
