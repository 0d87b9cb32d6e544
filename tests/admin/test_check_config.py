"""
check-config reports every problem of a config at once, one line each: the
file's mistakes with their keys, the files it names, each plugin section,
and with --online the servers it names.
"""

from __future__ import annotations

import json
import os

import pytest_twisted

from authsrv.identity.passwords import hash_password

from conftest import admin, free_port, ok
from slapd import PEOPLE

SEVERAL_MISTAKES = """\
[server]
public_url = "https://id.example/"
listen = ["ssl:8443:privateKey=missing-key.pem:certKey=missing-cert.pem"]
drain_delay = "soon"
colour = "blue"

[internal]
secret_file = "no-such-secret"

[limits]
session_ttl = []
code_ttl = 0

[passwords]
min_length = 4

[keystore]
path = "keys.jwks.json"

[[identity]]
plugin = "static"
path = "users.toml"

[[clients]]
client_id = "app"
redirect_uris = ["http://app.example/cb"]

[[clients]]
client_id = "other"
redirect_uris = ["https://other.example/cb"]
grant_types = ["password"]
"""


def problems(result, config) -> list[str]:
    """The problems reported, without the command's and the file's names."""
    assert result.returncode == 1 and result.stdout == "", result
    prefix = f"authsrv-admin: {config}: "
    lines = result.stderr.splitlines()
    assert all(line.startswith(prefix) for line in lines), lines
    return [line.removeprefix(prefix) for line in lines]


@pytest_twisted.ensureDeferred
async def test_every_mistake_at_once(tmp_path):
    (tmp_path / "users.toml").write_text('[[users]]\nsub = "x"\n')
    (tmp_path / "keys.jwks.json").write_text("{not json")
    (tmp_path / "keys.jwks.json").chmod(0o600)
    config = tmp_path / "authsrv.toml"
    config.write_text(SEVERAL_MISTAKES)
    found = problems(await admin("check-config", str(config), cwd=tmp_path), config)
    keys = [line.split(": ", 1)[0] for line in found]
    assert keys == [
        "server.drain_delay",
        "server.colour",
        "internal.secret_file",
        "limits.code_ttl",
        "limits.session_ttl",
        "passwords.min_length",
        "clients[0].redirect_uris[0]",
        "clients[1].grant_types[0]",
        "server.listen[0]",
        "keystore.path",
        "users.toml",
    ], found
    assert "server.colour: unknown key" in found
    assert "passwords.min_length: must be at least 8, not 4" in found
    assert any("cannot read" in line and "no-such-secret" in line for line in found)
    assert any(line.startswith("keystore.path:") and "is not a valid key file" in line for line in found)
    assert any("users[0].login: is required" in line for line in found)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["authsrv.toml", "keys.jwks.json", "users.toml"]


@pytest_twisted.ensureDeferred
async def test_the_server_names_the_first_mistake_and_counts_the_rest(tmp_path):
    from authsrv.config import ConfigFileError, load_config

    config = tmp_path / "authsrv.toml"
    config.write_text('[server]\ndrain_delay = "soon"\ncolour = "blue"\n[limits]\ncode_ttl = 0\n')
    try:
        load_config(config)
    except ConfigFileError as e:
        assert str(e).startswith(f"{config}: server.drain_delay: must be a duration")
        assert str(e).endswith("(and 2 more: authsrv-admin check-config lists them all)")
        assert len(e.problems) == 3 and "\n" not in str(e)
    else:
        raise AssertionError("the config was taken")


@pytest_twisted.ensureDeferred
async def test_a_good_config_is_ok_and_its_key_file_is_loaded(deployment):
    cwd, config = deployment
    ok(await admin("keys", "list", "--config", config, cwd=cwd))
    assert ok(await admin("check-config", "--config", config, cwd=cwd)).endswith(
        ": ok (issuer http://127.0.0.1:8080/api/auth)\n")
    keys = cwd / "data" / "keys.jwks.json"
    document = json.loads(keys.read_text())
    document["keys"][0]["kty"] = "nonsense"
    keys.write_text(json.dumps(document))
    [problem] = problems(await admin("check-config", config, cwd=cwd), config)
    assert problem.startswith("keystore.path:") and "is not a valid key file" in problem


@pytest_twisted.ensureDeferred
async def test_online_names_the_servers_that_cannot_be_reached(tmp_path, pg_dsn):
    (tmp_path / "users.toml").write_text("")
    config = tmp_path / "authsrv.toml"
    closed = free_port()
    config.write_text(f"""\
[store]
plugin = "postgres"
dsn = "host=127.0.0.1 port={closed} dbname=authsrv connect_timeout=2"

[keystore]
plugin = "postgres"
dsn = {json.dumps(pg_dsn)}

[[identity]]
plugin = "ldap"
urls = ["ldap://127.0.0.1:{closed}"]
user_base_dn = "{PEOPLE}"

[[identity]]
plugin = "static"
""")
    ok(await admin("check-config", str(config), cwd=tmp_path))
    found = problems(await admin("check-config", "--online", str(config), cwd=tmp_path), config)
    assert [line.split(": ", 1)[0] for line in found] == ["store.dsn", "identity[0].urls"], found
    assert "cannot connect" in found[0] and str(closed) in found[1]


@pytest_twisted.ensureDeferred
async def test_online_passes_when_every_server_answers(tmp_path, pg_dsn, slapd):
    (tmp_path / "users.toml").write_text(
        f'[[users]]\nsub = "u1"\nlogin = "alice"\npassword_hash = "{hash_password("violet kettle harbour")}"\n')
    config = tmp_path / "authsrv.toml"
    config.write_text(f"""\
[store]
plugin = "postgres"
dsn = {json.dumps(pg_dsn)}

[[identity]]
plugin = "ldap"
urls = ["{slapd.url}"]
user_base_dn = "{PEOPLE}"

[[identity]]
plugin = "static"
""")
    assert ok(await admin("check-config", "--online", "-c", str(config), cwd=tmp_path)).startswith(f"{config}: ok")


LISTENERS = """\
[server]
listen = ["tcp:http-alt", "tcp:0:interface=127.0.0.1"]

[internal]
listen = ["bogus:8081"]

[admin]
listen = ["ssl:9443:privateKey=no-admin.key:certKey=no-admin.crt"]

[metrics]
listen = ["tcp:9100:interface=127.0.0.1:colour=blue", "ssl:9101:privateKey=no-metrics.key"]

[[identity]]
plugin = "static"
path = "users.toml"
"""


@pytest_twisted.ensureDeferred
async def test_every_listen_string_is_parsed_and_its_tls_files_checked(tmp_path):
    (tmp_path / "users.toml").write_text("")
    config = tmp_path / "authsrv.toml"
    config.write_text(LISTENERS)
    found = problems(await admin("check-config", str(config), cwd=tmp_path), config)
    assert [line.split(": ", 1)[0] for line in found] == [
        "server.listen[0]", "internal.listen[0]", "admin.listen[0]", "metrics.listen[0]", "metrics.listen[1]",
    ], found
    assert "'tcp:http-alt' is not a valid endpoint" in found[0]
    assert "'bogus:8081' is not a valid endpoint (Unknown endpoint type: 'bogus')" in found[1]
    assert found[2] == f"admin.listen[0]: privateKey {tmp_path}/no-admin.key: no such file"
    assert "colour" in found[3]
    assert found[4] == f"metrics.listen[1]: privateKey {tmp_path}/no-metrics.key: no such file"


@pytest_twisted.ensureDeferred
async def test_two_listeners_on_one_port_are_named_together(tmp_path):
    """The server would bind the first, then blame the second's port on some other program."""
    (tmp_path / "users.toml").write_text("")
    config = tmp_path / "authsrv.toml"
    config.write_text('[server]\nlisten = ["tcp:8080:interface=127.0.0.1"]\n'
                      '[metrics]\nlisten = ["tcp:8080"]\n[[identity]]\nplugin = "static"\npath = "users.toml"\n')
    assert problems(await admin("check-config", str(config), cwd=tmp_path), config) == [
        "metrics.listen[0]: 'tcp:8080' binds port 8080, as server.listen[0] does; give each listener a port of its own"
    ]


@pytest_twisted.ensureDeferred
async def test_log_files_the_server_could_not_open_are_named_and_none_is_created(tmp_path):
    (tmp_path / "users.toml").write_text("")
    (tmp_path / "logs").mkdir()
    config = tmp_path / "authsrv.toml"
    config.write_text('[server]\naccess_log_path = "logs"\n[audit]\npath = "gone/audit.log"\n'
                      '[[identity]]\nplugin = "static"\npath = "users.toml"\n')
    assert problems(await admin("check-config", str(config), cwd=tmp_path), config) == [
        f"audit.path: cannot open {tmp_path}/gone/audit.log: No such file or directory",
        f"server.access_log_path: cannot open {tmp_path}/logs: Is a directory",
    ]
    config.write_text('[server]\naccess_log_path = "logs/access.log"\n[audit]\npath = "audit.log"\n'
                      '[[identity]]\nplugin = "static"\npath = "users.toml"\n')
    assert ok(await admin("check-config", str(config), cwd=tmp_path)).startswith(f"{config}: ok")
    assert not (tmp_path / "audit.log").exists() and not list((tmp_path / "logs").iterdir())
    os.mkfifo(tmp_path / "audit.log")
    assert ok(await admin("check-config", str(config), cwd=tmp_path)).startswith(f"{config}: ok"), (
        "a named pipe is left unopened, whether or not a shipper reads it"
    )


@pytest_twisted.ensureDeferred
async def test_json_names_what_was_checked_and_each_problems_key(tmp_path):
    (tmp_path / "users.toml").write_text("")
    config = tmp_path / "authsrv.toml"
    config.write_text(LISTENERS.replace('[server]\n', '[server]\ncolour = "blue"\n'))
    result = await admin("--json", "check-config", str(config), cwd=tmp_path)
    assert result.returncode == 1 and result.stderr == "", result
    report = json.loads(result.stdout)
    assert {k: v for k, v in report.items() if k != "problems"} == {
        "file": str(config), "ok": False, "issuer": None, "checked": ["file", "listeners", "plugins"]}
    assert [p["key"] for p in report["problems"]] == [
        "server.colour", "server.listen[0]", "internal.listen[0]", "admin.listen[0]", "metrics.listen[0]",
        "metrics.listen[1]",
    ]
    assert report["problems"][0] == {"key": "server.colour", "problem": "unknown key"}


@pytest_twisted.ensureDeferred
async def test_json_of_a_good_config_and_of_a_file_that_is_not_toml(tmp_path):
    (tmp_path / "users.toml").write_text("")
    config = tmp_path / "authsrv.toml"
    config.write_text('[[identity]]\nplugin = "static"\npath = "users.toml"\n')
    report = json.loads(ok(await admin("check-config", str(config), "--json", cwd=tmp_path)))
    assert report == {"file": str(config), "ok": True, "issuer": "http://127.0.0.1:8080/api/auth",
                      "checked": ["file", "listeners", "plugins"], "problems": []}
    config.write_text("x = [")
    result = await admin("check-config", str(config), "--json", cwd=tmp_path)
    assert result.returncode == 1 and result.stderr == ""
    [problem] = json.loads(result.stdout)["problems"]
    assert problem["key"] is None and "invalid TOML" in problem["problem"]
