"""
The operator command's exit status tells a script what to do next: 0 done,
1 refused or not found (fix the input), 2 a usage mistake, 69 a database or
directory that did not answer (try again later), each with one line.
"""

from __future__ import annotations

import pytest_twisted

from conftest import admin, free_port, refused


def unavailable(result, message: str) -> None:
    assert result.returncode == 69, (result.returncode, result.stdout, result.stderr)
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line and result.stdout == ""
    assert line.startswith("authsrv-admin: ") and message in line, line


@pytest_twisted.ensureDeferred
async def test_not_found_is_1_and_usage_is_2(deployment):
    cwd, config = deployment
    refused(await admin("client", "show", "nope", "-c", config, cwd=cwd), "no client 'nope'")
    assert (await admin("client", "show", cwd=cwd)).returncode == 2


@pytest_twisted.ensureDeferred
async def test_a_store_that_does_not_answer_is_69(tmp_path):
    (tmp_path / "users.toml").write_text("")
    config = tmp_path / "authsrv.toml"
    config.write_text(f'[store]\nplugin = "postgres"\ndsn = "host=127.0.0.1 port={free_port()} dbname=x"\n')
    unavailable(await admin("client", "show", "nope", "-c", str(config), cwd=tmp_path), "store.dsn: cannot use")


@pytest_twisted.ensureDeferred
async def test_a_directory_that_does_not_answer_is_69(tmp_path):
    config = tmp_path / "authsrv.toml"
    config.write_text(f'[[identity]]\nplugin = "ldap"\nurls = ["ldap://127.0.0.1:{free_port()}"]\n'
                      'user_base_dn = "ou=people,dc=example,dc=org"\n')
    unavailable(await admin("user", "show", "alice", "-c", str(config), cwd=tmp_path), "directory unavailable")
    unavailable(await admin("ban", "alice", "--reason", "x", "-c", str(config), cwd=tmp_path),
                "directory unavailable")
