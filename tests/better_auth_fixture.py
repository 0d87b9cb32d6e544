"""
The Better Auth database made by Better Auth itself
(tests/fixtures/better_auth/README.md): loading its dump into a test
database, and the plaintext values its manifest keeps.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

from pgcluster import _binaries

FOLDER = Path(__file__).parent / "fixtures" / "better_auth"
MANIFEST = json.loads((FOLDER / "manifest.json").read_text())
MADE_AT = int(datetime.fromisoformat(MANIFEST["made_at"].replace("Z", "+00:00")).timestamp())
"""When Better Auth made the database: tests run their clocks from here, not from the wall clock."""

USERS = MANIFEST["users"]


def psql() -> str:
    found = shutil.which("psql")
    return found or str(_binaries() / "psql")


def load(dsn: str) -> None:
    """Load the dump into the empty database C{dsn} (a libpq keyword DSN)."""
    subprocess.run(
        [psql(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(FOLDER / "better_auth.sql"), dsn],
        check=True, capture_output=True,
    )
