"""
authsrv-admin as an operator uses it, against a real config, store, users
file and keystore: in the tests' process (see conftest.admin), and once as
the installed script.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import pytest_twisted
from argon2 import PasswordHasher

from authsrv.tokens import client_secret_hash, token_hash

from conftest import admin, ok, refused


@pytest_twisted.ensureDeferred
async def test_client_lifecycle(deployment):
    cwd, config = deployment
    out = ok(await admin("--config", config, "client", "add", "web", "--name", "Web Shop",
                   "--redirect-uri", "https://shop.example/cb", "--redirect-uri", "http://127.0.0.1:9000/cb",
                   "--post-logout-redirect-uri", "https://shop.example/", "--end-session",
                   "--first-party", "--resource", "https://api.example", cwd=cwd))
    secret = out.split("client_secret:")[1].strip()
    assert len(secret) >= 43  # 256 bits, base64url
    database = sqlite3.connect(cwd / "data" / "authsrv.sqlite3")
    dump = "\n".join(database.iterdump())
    key = database.execute("SELECT key FROM server_keys WHERE name = 'client-secrets'").fetchone()[0]
    assert secret not in dump and token_hash(secret) not in dump
    assert client_secret_hash(secret, key) in dump

    shown = json.loads(ok(await admin("--config", config, "client", "show", "web", "--json", cwd=cwd)))
    assert shown == {
        "client_id": "web",
        "name": "Web Shop",
        "type": "confidential",
        "redirect_uris": ["https://shop.example/cb", "http://127.0.0.1:9000/cb"],
        "post_logout_redirect_uris": ["https://shop.example/"],
        "end_session_enabled": True,
        "first_party": True,
        "resources": ["https://api.example"],
        "introspect_any": False,
        "backchannel_logout_uri": None,
        "created_at": shown["created_at"],
        "grant_types": ["authorization_code", "refresh_token"],
        "source": "operator",
        "refresh_grace": None,
        "rate_limit": None,
        "audiences": [],
        "previous_secret_until": None,
        "require_mfa": False,
        "require_pushed_authorization_requests": False,
        "profile": None,
        "id_token_signed_response_alg": "RS256",
        "access_token_signed_response_alg": "RS256",
        "userinfo_signed_response_alg": None,
        "token_endpoint_auth_method": None,
        "jwks": None,
        "jwks_uri": None,
        "scopes": [],
        "dpop_bound_access_tokens": False,
    }
    assert "client_secret" not in ok(await admin("--config", config, "client", "show", "web", cwd=cwd))
    ok(await admin("--config", config, "client", "add", "spa", "--public", "--redirect-uri", "https://spa.example/cb", cwd=cwd))
    listed = ok(await admin("--config", config, "client", "list", cwd=cwd)).splitlines()
    assert listed == ["spa\tpublic\t-\tspa", "web\tconfidential\tfirst-party,end-session\tWeb Shop"]
    refused(await admin("--config", config, "client", "add", "web", "--redirect-uri", "https://x.example/cb", cwd=cwd),
            "client 'web' exists already")
    assert ok(await admin("--config", config, "client", "remove", "web", cwd=cwd)) == "removed client web\n"
    refused(await admin("--config", config, "client", "show", "web", cwd=cwd), "no client 'web'")
    refused(await admin("--config", config, "client", "remove", "web", cwd=cwd), "no client 'web'")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--redirect-uri", "http://shop.example/cb"], "--redirect-uri: 'http://shop.example/cb' must use https"),
        (["--redirect-uri", "https://shop.example/cb#frag"], "must not contain a fragment"),
        (["--redirect-uri", "/relative"], "is not an absolute URI"),
        (["--redirect-uri", "https://a.example/cb", "--post-logout-redirect-uri", "https://a.example/"],
         "--post-logout-redirect-uri needs --end-session"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_client_add_refuses_bad_input(deployment, args, message):
    cwd, config = deployment
    refused(await admin("--config", config, "client", "add", "app", *args, cwd=cwd), message)


@pytest_twisted.ensureDeferred
async def test_client_add_bad_id_and_missing_option(deployment):
    cwd, config = deployment
    refused(await admin("--config", config, "client", "add", "a b", "--redirect-uri", "https://a.example/cb", cwd=cwd),
            "may hold only printable ASCII")
    refused(await admin("--config", config, "client", "add", "app", cwd=cwd),
            "--redirect-uri: must name at least one URI (only a client_credentials client needs none)")


@pytest_twisted.ensureDeferred
async def test_clients_declared_in_the_config_are_edited_there(tmp_path):
    (tmp_path / "users.toml").write_text("")
    config = tmp_path / "authsrv.toml"
    config.write_text('[[clients]]\nclient_id = "fixed"\nredirect_uris = ["https://a.example/cb"]\n')
    refused(await admin("--config", str(config), "client", "add", "fixed", "--redirect-uri", "https://b.example/cb",
                  cwd=tmp_path), "is declared in")
    refused(await admin("--config", str(config), "client", "remove", "fixed", cwd=tmp_path), "is declared in")


@pytest_twisted.ensureDeferred
async def test_user_add_hashes_the_password(deployment):
    cwd, config = deployment
    out = ok(await admin("--config", config, "user", "add", "alice", "--name", "Alice", "--email", "alice@example.com",
                   "--email-verified", "--chat-user-id", "80351110224678912", "--password-stdin",
                   cwd=cwd, stdin="correct horse battery\n"))
    assert out.startswith("added user alice (sub ")
    users = tomllib.loads((cwd / "data" / "users.toml").read_text())["users"]
    assert len(users) == 1
    alice = users[0]
    assert (alice["login"], alice["name"], alice["email"], alice["email_verified"], alice["chat_user_id"]) == (
        "alice", "Alice", "alice@example.com", True, "80351110224678912")
    assert alice["password_hash"].startswith("$argon2id$")
    assert PasswordHasher().verify(alice["password_hash"], "correct horse battery")
    assert "correct horse battery" not in (cwd / "data" / "users.toml").read_text()
    refused(await admin("--config", config, "user", "add", "ALICE", "--password-stdin", cwd=cwd, stdin="Tr0ub4dor&3x\n"),
            "already")
    refused(await admin("--config", config, "user", "add", "ｂｏｂ", cwd=cwd, stdin="pw\n"),
            "give it as 'bob'")  # before the password is asked for
    refused(await admin("--config", config, "user", "add", "ａｌｉｃｅ", cwd=cwd, stdin="pw\n"),
            "looks like 'alice', the login of user")  # a look-alike of alice, before the password too
    refused(await admin("--config", config, "user", "add", "bob", "--password-stdin", cwd=cwd, stdin="\n"),
            "the password must not be empty")
    refused(await admin("--config", config, "user", "add", "bob", cwd=cwd, stdin="pw\n"),
            "no terminal to ask for the password")
    refused(await admin("--config", config, "user", "add", "bob", "--email", "nope", "--password-stdin", cwd=cwd,
                  stdin="pw\n"), "is not an email address")


@pytest_twisted.ensureDeferred
async def test_user_passwd_disable_enable_in_the_users_file(deployment):
    cwd, config = deployment
    users_file = cwd / "data" / "users.toml"
    await add_alice(cwd, config)
    assert ok(await admin("--config", config, "user", "passwd", "ALICE", "--password-stdin", cwd=cwd,
                          stdin="a new passphrase\n")) == "password of ALICE changed\n"
    [alice] = tomllib.loads(users_file.read_text())["users"]
    assert PasswordHasher().verify(alice["password_hash"], "a new passphrase")
    assert ok(await admin("--config", config, "user", "disable", "alice", "--reason", "left", cwd=cwd)) == (
        "disabled alice; 0 browser sessions ended\n")
    [alice] = tomllib.loads(users_file.read_text())["users"]
    assert (alice["disabled"], alice["disabled_reason"]) == (True, "left")
    assert ok(await admin("--config", config, "user", "enable", "alice", cwd=cwd)) == "enabled alice\n"
    assert "disabled" not in users_file.read_text().split("[[users]]")[1]
    refused(await admin("--config", config, "user", "disable", "bob", "--reason", "x", cwd=cwd),
            "no user 'bob' (by id or login)")


@pytest_twisted.ensureDeferred
async def test_hash_password(tmp_path):
    out = ok(await admin("hash-password", "--password-stdin", cwd=tmp_path, stdin="s3cret enough\n")).strip()
    assert PasswordHasher().verify(out, "s3cret enough")


@pytest_twisted.ensureDeferred
async def test_keys_list_and_rotate(deployment):
    cwd, config = deployment
    before = [line.split("\t") for line in ok(await admin("--config", config, "keys", "list", cwd=cwd)).splitlines()]
    states = {state: kid for kid, alg, state in before}
    assert set(states) == {"active", "next"}
    refused(await admin("--config", config, "keys", "rotate", cwd=cwd), "relying parties cache the JWKS for 600 s")
    refused(await admin("--config", config, "keys", "rotate", cwd=cwd), "or now with --force (tokens it signs")
    after = [line.split("\t") for line in ok(await admin("--config", config, "keys", "rotate", "--force", cwd=cwd)).splitlines()]
    now = {kid: state for kid, alg, state in after}
    assert now[states["next"]] == "active"
    assert now[states["active"]] == "retired"
    assert sorted(now.values()) == ["active", "next", "retired"]


@pytest_twisted.ensureDeferred
async def test_check_config(deployment, tmp_path):
    cwd, config = deployment
    assert ok(await admin("check-config", config, cwd=cwd)).endswith(": ok (issuer http://127.0.0.1:8080/api/auth)\n")
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\nsession_ttl = []\n")
    lines = (await admin("check-config", str(bad), cwd=cwd)).stderr.splitlines()
    assert lines[0].startswith(f"authsrv-admin: {bad}: limits.session_ttl: must be a duration")
    assert lines[1].startswith(f"authsrv-admin: {bad}: identity[0].path:") and len(lines) == 2
    refused(await admin("client", "list", cwd=tmp_path / "data"), "no config file: pass --config FILE")


@pytest.mark.parametrize(
    "text, message",
    [
        ('[store]\nplugin = "sqlite"\nsynchronous = "sometimes"\n', "store.synchronous: must be one of"),
        ('[keystore]\nalgorithms = ["HS256"]\n', "keystore.algorithms"),
        ('[keystore]\nplugin = "nope"\n', "keystore.plugin: no keystore plugin named 'nope'"),
        ("[[identity]]\nplugin = \"static\"\npath = \"missing.toml\"\n", "identity[0].path:"),
        ("", "users.toml: users[0].login: is required"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_check_config_checks_plugin_sections_without_creating_anything(tmp_path, text, message):
    (tmp_path / "users.toml").write_text('[[users]]\nsub = "x"\n')
    config = tmp_path / "authsrv.toml"
    config.write_text(text)
    checked = await admin("check-config", str(config), cwd=tmp_path)
    assert checked.returncode == 1
    lines = checked.stderr.splitlines()
    assert all(line.startswith(f"authsrv-admin: {config}: ") for line in lines)
    assert any(message in line for line in lines), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["authsrv.toml", "users.toml"]


@pytest_twisted.ensureDeferred
async def test_check_config_of_a_new_deployment_creates_nothing(tmp_path):
    (tmp_path / "users.toml").write_text("")
    config = tmp_path / "authsrv.toml"
    config.write_text('[keystore]\nplugin = "pem"\n')
    ok(await admin("check-config", str(config), cwd=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["authsrv.toml", "users.toml"]


async def add_alice(cwd, config):
    out = ok(await admin("--config", config, "user", "add", "alice", "--password-stdin", cwd=cwd,
                   stdin="long enough pass\n"))
    return out.split("(sub ")[1].split(")")[0]


@pytest_twisted.ensureDeferred
async def test_ban_unban_revoke(deployment):
    cwd, config = deployment
    sub = await add_alice(cwd, config)
    banned = await admin("--config", config, "ban", "alice", "--reason", "spam", "--for", "7d", cwd=cwd)
    assert ok(banned).startswith(f"banned {sub} until 20")
    audit = [json.loads(line) for line in banned.stderr.splitlines()]
    assert [e["event"] for e in audit] == ["user.banned"] and audit[0]["reason"] == "spam"
    listed = ok(await admin("--config", config, "bans", cwd=cwd)).split("\t")
    assert listed[0] == sub and listed[2].strip() == "spam" and listed[1].endswith("Z")
    assert ok(await admin("--config", config, "unban", sub, cwd=cwd)) == f"unbanned {sub}\n"
    refused(await admin("--config", config, "unban", sub, cwd=cwd), "is not banned")
    assert ok(await admin("--config", config, "bans", cwd=cwd)) == ""
    revoked = await admin("--config", config, "revoke", "alice", cwd=cwd)
    assert ok(revoked).startswith(f"revoked 0 grants of {sub}")
    assert json.loads(revoked.stderr)["event"] == "user.grants_revoked"


@pytest_twisted.ensureDeferred
async def test_reset_factors_is_audited(deployment):
    cwd, config = deployment
    sub = await add_alice(cwd, config)
    assert "had no second factors" in ok(await admin("--config", config, "user", "reset-factors", sub, cwd=cwd))
    database = sqlite3.connect(cwd / "data" / "authsrv.sqlite3")
    with database:
        database.execute("INSERT INTO totp_factors VALUES (?, x'00', 0, 0)", (sub,))
    reset = await admin("--config", config, "user", "reset-factors", "alice", cwd=cwd)
    assert ok(reset) == f"second factors of alice (sub {sub}) removed; they enrol again at sign-in\n"
    assert [json.loads(line)["event"] for line in reset.stderr.splitlines()] == ["mfa.reset"]
    assert database.execute("SELECT count(*) FROM totp_factors").fetchone()[0] == 0
    refused(await admin("--config", config, "user", "reset-factors", "nobody", cwd=cwd), "no user 'nobody'")


@pytest.mark.parametrize("until", [78166738680462065664, 253402300800, "10000-01-01T00:00:00Z"])
def test_a_ban_ending_beyond_any_date_is_refused_not_stored(until):
    """Found by the admin API's fuzzing: an end past what a date or a 64-bit column holds was a 500."""
    from authsrv.operations.errors import InvalidInput
    from authsrv.operations.users import LATEST_UNTIL, parse_until

    with pytest.raises(InvalidInput) as refused_input:
        parse_until(until, 1_700_000_000)
    assert "too far ahead" in refused_input.value.message or "ISO 8601" in refused_input.value.message
    assert parse_until(LATEST_UNTIL, 1_700_000_000) == LATEST_UNTIL


@pytest.mark.parametrize(
    "args, message",
    [
        (["ban", "nobody", "--reason", "x"], "no user 'nobody' (by id or login)"),
        (["ban", "alice", "--reason", "x", "--for", "soon"], "is not a duration"),
        (["ban", "alice", "--reason", "x", "--until", "tomorrow"], "is not an ISO 8601 time"),
        (["ban", "alice", "--reason", "x", "--until", "2001-01-01T00:00:00Z"], "is in the past"),
        (["ban", "alice", "--reason", "x", "--until", "2099-01-01T00:00:00"], "needs a time zone"),
        (["ban", "alice", "--reason", "x", "--for", "1d", "--until", "2099-01-01T00:00:00Z"], "not both"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_ban_refuses_bad_input(deployment, args, message):
    cwd, config = deployment
    await add_alice(cwd, config)
    refused(await admin("--config", config, *args, cwd=cwd), message)


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_the_installed_script(deployment):
    """The one run as a child process: the script, its exit status and its audit lines on stderr."""
    cwd, config = deployment
    sub = await add_alice(cwd, config)
    script = Path(sys.executable).parent / "authsrv-admin"
    banned = subprocess.run([str(script), "--config", config, "ban", "alice", "--reason", "spam"],
                            cwd=cwd, capture_output=True, text=True, timeout=60)
    assert banned.returncode == 0 and banned.stdout == f"banned {sub}; 0 browser sessions ended\n", banned
    assert [json.loads(line)["event"] for line in banned.stderr.splitlines()] == ["user.banned"]
    again = subprocess.run([str(script), "--config", config, "unban", "nobody"],
                           cwd=cwd, capture_output=True, text=True, timeout=60)
    assert (again.returncode, again.stderr) == (1, "authsrv-admin: no user 'nobody' (by id or login)\n")


async def alice_linked_at(fake, reactor, cwd: Path, config: str) -> tuple:
    """
    Alice added, the config pointed at C{fake} (listening on 127.0.0.1), and
    a link of hers stored with tokens the fake honours; returns the fake's
    port and those tokens.
    """
    from authsrv.chat.crypto import ACCESS, REFRESH, TokenCipher, key_from_text, new_key_text

    port = fake.listen(reactor)
    key_text = new_key_text()
    folder = Path(config).parent
    (folder / "chat.key").write_text(key_text + "\n")
    (folder / "chat-client-secret").write_text(fake.client_secret + "\n")
    endpoints = fake.endpoints(f"http://127.0.0.1:{port.getHost().port}")
    with open(config, "a") as file:
        file.write('\n[chat]\nencryption_key_file = "chat.key"\nclient_secret_file = "chat-client-secret"\ntimeout = "2s"\n'
                   + "".join(f'{name} = "{value}"\n' for name, value in endpoints.items()))
    sub = await add_alice(cwd, config)
    grant = fake.grant()
    cipher = TokenCipher(key_from_text(key_text))
    database = sqlite3.connect(folder / "authsrv.sqlite3")
    with database:
        database.execute("INSERT INTO linked_accounts VALUES ('acct-alice', ?, 'discord', ?, ?, ?, 'identify', 0, 0, 1)",
                         (sub, fake.user.id, cipher.encrypt(grant["access_token"], "acct-alice", ACCESS),
                          cipher.encrypt(grant["refresh_token"], "acct-alice", REFRESH)))
    database.close()
    return port, grant["access_token"], grant["refresh_token"]


@pytest.mark.parametrize("down", [False, True])
@pytest_twisted.ensureDeferred
async def test_user_remove_revokes_the_chat_links_tokens_at_the_platform(deployment, reactor, down):
    """
    Removing a user dropped their chat link's tokens but left them valid at
    the platform: the command revokes them there before it exits; a platform
    that is down fails nothing, the user is removed all the same.
    """
    from authsrv.testing.fake_chat import FakeChatProvider

    cwd, config = deployment
    fake = FakeChatProvider(reactor)
    port, access, refresh = await alice_linked_at(fake, reactor, cwd, config)
    try:
        fake.down = down
        removed = await admin("--config", config, "user", "remove", "alice", cwd=cwd)
        assert ok(removed).startswith("removed user alice")
        assert access not in removed.stderr and refresh not in removed.stderr
        assert fake.revocations == ([] if down else [(access, "access_token"), (refresh, "refresh_token")])
        with sqlite3.connect(cwd / "data" / "authsrv.sqlite3") as database:
            assert database.execute("SELECT count(*) FROM linked_accounts").fetchone() == (0,)
        refused(await admin("--config", config, "user", "show", "alice", cwd=cwd), "alice")
    finally:
        await port.stopListening()
