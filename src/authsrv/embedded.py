"""
The embedded default: C{twist authsrv} with no config creates a data folder
holding a config file that names an SQLite store, a generated keystore and a
static users file, so that the operator command and a later restart find
everything where the first start put it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from pathlib import Path

from attrs import frozen

from authsrv.identity.static import create_users_file

DEFAULT_DATA_DIR = "authsrv-data"
CONFIG_NAME = "authsrv.toml"

_CONFIG = """\
# authsrv embedded default, written on first start. Edit it freely: it is an
# ordinary config file (see the configuration reference in the README).
# Relative paths are relative to this file's folder.

[server]
public_url = "http://127.0.0.1:8080"
listen = ["tcp:8080:interface=127.0.0.1"]

[internal]
secret_file = "internal-api-secret"

[store]
plugin = "sqlite"
path = "authsrv.sqlite3"

[keystore]
plugin = "jwk-file"
path = "keys.jwks.json"

[[identity]]
plugin = "static"
path = "users.toml"
"""

def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


@frozen
class Created:
    """What a first start created, to tell the operator."""

    data_dir: Path
    config: Path

    def summary(self, issuer: str) -> str:
        files = [
            (self.config, "the config file (edit it; restarts keep everything)"),
            (self.data_dir / "authsrv.sqlite3", "the SQLite store"),
            (self.data_dir / "keys.jwks.json", "the signing keys (mode 0600)"),
            (self.data_dir / "users.toml", "the users file"),
            (self.data_dir / "internal-api-secret", "the internal API secret (mode 0600)"),
        ]
        width = max(len(str(path)) for path, _ in files)
        return "\n".join(
            [f"authsrv: first start: created the data folder {self.data_dir}/:"]
            + [f"  {str(path):<{width}}  {what}" for path, what in files]
            + [
                "Add a user (asks for the password):",
                f"  {_admin_command()} --config {self.config} user add alice",
                "Add a client (prints its secret once):",
                f"  {_admin_command()} --config {self.config} client add my-app"
                " --redirect-uri http://127.0.0.1:9000/callback",
                f"Discovery: {issuer}/.well-known/openid-configuration",
            ]
        )


def _admin_command() -> str:
    """
    How to call the operator command from here: the script beside this
    Python (a virtualenv's bin folder) when it is not on the PATH.
    """
    beside = Path(sys.executable).parent / "authsrv-admin"
    if shutil.which("authsrv-admin") == str(beside) or not beside.exists():
        return "authsrv-admin"
    return os.path.relpath(beside)


def prepare_data_dir(data_dir: Path) -> tuple[Path, Created | None]:
    """
    The config file of the embedded default, writing the data folder first if
    it has none yet; the second value says what was created, if anything.
    """
    config = data_dir / CONFIG_NAME
    if config.exists():
        return config, None
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    secret = data_dir / "internal-api-secret"
    if not secret.exists():
        _write_private(secret, secrets.token_urlsafe(32) + "\n")
    create_users_file(data_dir / "users.toml")
    _write_private(config, _CONFIG)
    return config, Created(data_dir=data_dir, config=config)
