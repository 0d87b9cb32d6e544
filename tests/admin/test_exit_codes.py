"""
The operator command's exit status tells a script what to do next: 0 done,
1 refused or not found (fix the input), 2 a usage mistake, 69 a database or
directory that did not answer (try again later), 70 a bug, each with one line.
"""

from __future__ import annotations

import pytest_twisted

from authsrv.store.sqlite import SQLiteStore

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


SECRET = "hunter2-in-a-dsn"


def fail_unexpectedly(*_args):
    raise RuntimeError(f"cannot use postgresql://admin:{SECRET}@db/authsrv")


@pytest_twisted.ensureDeferred
async def test_an_unexpected_failure_is_70_with_one_line_and_no_secret(deployment, monkeypatch):
    cwd, config = deployment
    monkeypatch.delenv("AUTHSRV_ADMIN_DEBUG", raising=False)
    monkeypatch.setattr(SQLiteStore, "get_client", fail_unexpectedly)
    result = await admin("client", "show", "web", "-c", config, cwd=cwd)
    assert result.returncode == 70, (result.returncode, result.stdout, result.stderr)
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line and result.stdout == ""
    assert line.startswith("authsrv-admin: unexpected error: RuntimeError (at "), line
    assert "this is a bug, please report it with the command you ran" in line
    assert "AUTHSRV_ADMIN_DEBUG=1 shows the traceback" in line and SECRET not in line


@pytest_twisted.ensureDeferred
async def test_the_traceback_only_when_asked_for(deployment, monkeypatch):
    cwd, config = deployment
    monkeypatch.setenv("AUTHSRV_ADMIN_DEBUG", "1")
    monkeypatch.setattr(SQLiteStore, "get_client", fail_unexpectedly)
    result = await admin("client", "show", "web", "-c", config, cwd=cwd)
    assert result.returncode == 70
    assert result.stderr.startswith("Traceback") and "in fail_unexpectedly" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("authsrv-admin: unexpected error: RuntimeError")


@pytest_twisted.ensureDeferred
async def test_an_unexpected_os_error_names_its_cause_but_not_its_file(deployment, monkeypatch):
    cwd, config = deployment

    def unreadable(*_args):
        raise PermissionError(13, "Permission denied", f"/run/{SECRET}")

    monkeypatch.setattr(SQLiteStore, "get_client", unreadable)
    result = await admin("client", "show", "web", "-c", config, cwd=cwd)
    assert result.returncode == 70
    assert "unexpected error: PermissionError: Permission denied (at " in result.stderr
    assert SECRET not in result.stderr
