"""
The operator command's global options (before or after the subcommand),
--version, --json on every list and show, and the users of the static
users file: add, passwd, disable, enable, remove, list, show.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from importlib.metadata import version

import pytest
import pytest_twisted
from argon2 import PasswordHasher
from twisted.internet.task import Clock
from twisted.python.threadpool import ThreadPool

from authsrv.admin.main import _parser, _subcommands
from authsrv.identity.passwords import PasswordVerifier, hash_password
from authsrv.identity.static import RELOAD_INTERVAL, StaticIdentityBackend

from conftest import admin, file_work_here, ok, refused

COMMANDS = [
    ["client", "add", "app", "--redirect-uri", "https://a.example/cb"],
    ["client", "list"],
    ["client", "show", "app"],
    ["client", "remove", "app"],
    ["user", "add", "alice"],
    ["user", "passwd", "alice"],
    ["user", "disable", "alice", "--reason", "left"],
    ["user", "enable", "alice"],
    ["user", "remove", "alice"],
    ["user", "list"],
    ["user", "show", "alice"],
    ["hash-password"],
    ["keys", "list"],
    ["keys", "rotate"],
    ["ban", "alice", "--reason", "spam"],
    ["unban", "alice"],
    ["revoke", "alice"],
    ["bans"],
    ["check-config"],
]


def _leaves(parser):
    return [p for p in _subcommands(parser) if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)]


def test_every_command_takes_the_global_options():
    for leaf in _leaves(_parser()):
        options = {o: a for a in leaf._actions for o in a.option_strings}
        assert {"--config", "-c", "--json"} <= set(options), leaf.prog
        assert options["--config"].default is argparse.SUPPRESS and options["--json"].default is argparse.SUPPRESS


def test_every_argument_says_what_it_is_in_help():
    for leaf in _leaves(_parser()):
        silent = [a.dest for a in leaf._actions if not a.help]
        assert not silent, f"{leaf.prog}: no help text for {silent}"


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_global_options_before_or_after_the_subcommand(command):
    parser = _parser()
    for argv in (["--config", "a.toml", "--json", *command], [*command, "--config", "a.toml", "--json"],
                 ["-c", "a.toml", *command, "--json"], [command[0], "-c", "a.toml", "--json", *command[1:]]):
        args = parser.parse_args(argv)
        assert (args.config, args.json) == ("a.toml", True), argv
    args = parser.parse_args(command)
    assert (args.config, args.json) == (None, False)


def test_the_commands_listed_here_are_all_there_are():
    assert {leaf.prog.removeprefix("authsrv-admin ") for leaf in _leaves(_parser())} >= {
        " ".join(c[:2]) if c[0] in ("client", "user", "keys") else c[0] for c in COMMANDS
    }


@pytest_twisted.ensureDeferred
async def test_version(tmp_path):
    shown = await admin("--version", cwd=tmp_path)
    assert (shown.returncode, shown.stdout) == (0, f"authsrv-admin {version('authsrv')}\n")


@pytest_twisted.ensureDeferred
async def test_help_is_plain_text(tmp_path):
    shown = await admin("--help", cwd=tmp_path)
    assert shown.returncode == 0 and "authsrv-admin: the operator command" in shown.stdout
    assert "{" not in shown.stdout.split("positional arguments")[0]


@pytest_twisted.ensureDeferred
async def test_json_on_every_list_and_show_with_the_options_after(deployment):
    cwd, config = deployment
    ok(await admin("client", "add", "web", "--redirect-uri", "https://shop.example/cb", "--config", config, cwd=cwd))
    [client] = json.loads(ok(await admin("client", "list", "--json", "-c", config, cwd=cwd)))
    assert client["client_id"] == "web" and "secret_hash" not in client
    assert json.loads(ok(await admin("client", "show", "web", "-c", config, "--json", cwd=cwd))) == client

    keys = json.loads(ok(await admin("keys", "list", "--config", config, "--json", cwd=cwd)))
    assert sorted(k["state"] for k in keys) == ["active", "next"]
    assert set(keys[0]) == {"kid", "alg", "state", "created_at", "activated_at", "retired_at", "expires_at"}

    ok(await admin("user", "add", "alice", "--email", "alice@example.com", "--password-stdin", "-c", config,
                   cwd=cwd, stdin="violet kettle harbour\n"))
    [user] = json.loads(ok(await admin("user", "list", "--json", "--config", config, cwd=cwd)))
    assert user == {
        "sub": user["sub"], "login": "alice", "name": None, "picture": None, "email": "alice@example.com",
        "email_verified": False, "disabled": False, "disabled_reason": None, "chat_user_id": None,
    }
    assert json.loads(ok(await admin("user", "show", "ALICE", "--json", "--config", config, cwd=cwd))) == user

    assert json.loads(ok(await admin("bans", "--json", "--config", config, cwd=cwd))) == []
    ok(await admin("ban", "alice", "--reason", "spam", "--config", config, cwd=cwd))
    [ban] = json.loads(ok(await admin("--json", "bans", "--config", config, cwd=cwd)))
    assert (ban["sub"], ban["reason"], ban["until"]) == (user["sub"], "spam", None)
    assert isinstance(ban["created_at"], int)


@pytest_twisted.ensureDeferred
async def test_user_list_show_remove(deployment):
    cwd, config = deployment
    for login, name in (("bob", "Bob"), ("alice", None)):
        args = ["--name", name] if name else []
        ok(await admin("user", "add", login, *args, "--password-stdin", "--config", config,
                       cwd=cwd, stdin="violet kettle harbour\n"))
    ok(await admin("user", "disable", "bob", "--reason", "left", "--config", config, cwd=cwd))
    listed = [line.split("\t") for line in ok(await admin("user", "list", "--config", config, cwd=cwd)).splitlines()]
    assert [(login, state, name) for login, _, state, name in listed] == [
        ("alice", "enabled", "-"), ("bob", "disabled", "Bob")]
    shown = ok(await admin("user", "show", "bob", "--config", config, cwd=cwd))
    assert "login:           bob\n" in shown and "disabled_reason: left\n" in shown and "email:           -\n" in shown
    users_file = cwd / "data" / "users.toml"
    assert ok(await admin("user", "remove", "Bob", "--config", config, cwd=cwd)) == f"removed user Bob from {users_file}\n"
    assert [line.split("\t")[0] for line in ok(await admin("user", "list", "-c", config, cwd=cwd)).splitlines()] == [
        "alice"]
    refused(await admin("user", "remove", "bob", "--config", config, cwd=cwd), "no user 'bob' (by id or login)")
    refused(await admin("user", "show", "bob", "--config", config, cwd=cwd), "no user 'bob' (by id or login)")


@pytest.mark.parametrize("password, message", [
    ("short", "the password must be at least 8 characters long (it has 5)"),
    ("password1", "is one of the most common passwords"),
    ("alice-in-wonderland", "must not contain the user's login or email address"),
    ("x" * 1025, "at most 1,024 characters"),
])
@pytest_twisted.ensureDeferred
async def test_new_passwords_meet_the_policy(deployment, password, message):
    cwd, config = deployment
    refused(await admin("user", "add", "alice", "--password-stdin", "--config", config, cwd=cwd,
                        stdin=password + "\n"), message)
    assert "users" not in tomllib.loads((cwd / "data" / "users.toml").read_text())
    ok(await admin("user", "add", "alice", "--password-stdin", "--config", config, cwd=cwd,
                   stdin="violet kettle harbour\n"))
    refused(await admin("user", "passwd", "alice", "--password-stdin", "--config", config, cwd=cwd,
                        stdin=password + "\n"), message)
    refused(await admin("user", "passwd", "nobody", "--password-stdin", "--config", config, cwd=cwd,
                        stdin="violet kettle harbour\n"), "no user 'nobody' (by id or login)")


@pytest_twisted.ensureDeferred
async def test_passwd_names_an_unknown_user_before_asking_for_a_password(deployment):
    cwd, config = deployment
    refused(await admin("user", "passwd", "nobody", "--password-stdin", "--config", config, cwd=cwd, stdin=""),
            "no user 'nobody' (by id or login)")


@pytest_twisted.ensureDeferred
async def test_the_minimum_length_comes_from_the_config(deployment):
    cwd, config = deployment
    with open(config, "a") as file:
        file.write("\n[passwords]\nmin_length = 24\n")
    refused(await admin("user", "add", "alice", "--password-stdin", "--config", config, cwd=cwd,
                        stdin="violet kettle harbour\n"), "at least 24 characters long (it has 21)")
    refused(await admin("hash-password", "--password-stdin", "--config", config, cwd=cwd,
                        stdin="violet kettle harbour\n"), "at least 24 characters")
    ok(await admin("hash-password", "--password-stdin", cwd=cwd, stdin="violet kettle harbour\n"))


USERS_FILE = """\
# Staff accounts; ask the service desk before editing.

[[users]]
sub = "u-alice"
login = "alice"
password_hash = "{alice}"
# Alice keeps her e-mail private.

[[users]]
# Bob joined in spring.
sub = "u-bob"
login = "bob"
password_hash = "{bob}"

[[users]]
sub = "u-carol"
login = "carol"
password_hash = "{carol}"
# end of file
"""


@pytest_twisted.ensureDeferred
async def test_edits_keep_the_files_comments_and_order_and_reach_a_running_server(deployment):
    cwd, config = deployment
    users_file = cwd / "data" / "users.toml"
    users_file.write_text(USERS_FILE.format(**{u: hash_password(f"{u} old passphrase") for u in ("alice", "bob", "carol")}))
    clock = Clock()
    server = StaticIdentityBackend(users_file, clock, PasswordVerifier(None, ThreadPool()), file_work_here)

    ok(await admin("user", "disable", "alice", "--reason", "on leave", "-c", config, cwd=cwd))
    ok(await admin("user", "passwd", "carol", "--password-stdin", "-c", config, cwd=cwd,
                   stdin="a fresh harbour passphrase\n"))
    ok(await admin("user", "remove", "bob", "-c", config, cwd=cwd))

    text = users_file.read_text()
    for comment in ("# Staff accounts; ask the service desk before editing.", "# Alice keeps her e-mail private.",
                    "# end of file"):
        assert comment in text
    assert "bob" not in text.replace("# Bob joined in spring.", "")
    assert text.index('login = "alice"') < text.index("# Alice keeps") < text.index('login = "carol"')
    assert 'disabled = true\ndisabled_reason = "on leave"' in text

    # The server looks at the file at most once per reload interval.
    clock.advance(RELOAD_INTERVAL / 2)
    assert (await server.user_by_login("alice")).disabled is False
    assert await server.user_by_login("bob") is not None
    clock.advance(RELOAD_INTERVAL)
    alice = await server.user_by_login("alice")
    assert (alice.disabled, alice.disabled_reason) == (True, "on leave")
    assert await server.user_by_login("bob") is None
    [carol] = [u for u in tomllib.loads(text)["users"] if u["login"] == "carol"]
    assert PasswordHasher().verify(carol["password_hash"], "a fresh harbour passphrase")
