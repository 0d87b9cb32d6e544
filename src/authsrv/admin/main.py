"""
C{authsrv-admin}: the operator command.

It works on the same config file, store and keystore as the server, from a
separate process: the server picks up clients at once (it reads them from the
store), and keys and users within a minute (it re-reads changed files).
Secrets are printed once and stored only hashed; passwords are read from the
terminal or standard input, never from arguments.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import uuid
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

from attrs import asdict
from twisted.internet.defer import Deferred
from twisted.internet.task import react
from twisted.logger import (
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    globalLogBeginner,
    jsonFileLogObserver,
)

from authsrv import events
from authsrv.config import Config, ConfigFileError, load_config
from authsrv.configsection import parse_duration
from authsrv.context import PluginContext
from authsrv.embedded import CONFIG_NAME, DEFAULT_DATA_DIR
from authsrv.isotime import iso_utc
from authsrv.protocol.clients import client_id_problem, redirect_uri_problem
from authsrv.records import Ban, Client, User
from authsrv.service import JWKS_MAX_AGE, StartupError, build_identity, build_plugin
from authsrv.store.errors import AlreadyExists
from authsrv.tls import config_tls_problem
from authsrv.tokens import new_token, token_hash


class AdminError(Exception):
    """A mistake the operator can fix; printed as one line, exit status 1."""


def _config(args) -> Config:
    path = Path(args.config) if args.config else Path(DEFAULT_DATA_DIR) / CONFIG_NAME
    if not args.config and not path.exists():
        raise AdminError(
            f"no config file: pass --config FILE (or start `twist authsrv` once to create {path})"
        )
    try:
        return load_config(path)
    except ConfigFileError as e:
        raise AdminError(str(e)) from None


@asynccontextmanager
async def _plugin_context(reactor, config: Config, *, check_only: bool = False, prefix: str = ""):
    """
    The context one command builds plugins in: its thread pools stop with
    the command, and a plugin's start-up problem is one line.
    """
    context = PluginContext(reactor, config.base_dir, config.limits.max_token_lifetime, check_only=check_only)
    try:
        yield context
    except StartupError as e:
        raise AdminError(f"{prefix}{e}") from None
    finally:
        context.stop()


async def _with_plugin(reactor, args, role: str, use):
    config = _config(args)
    async with _plugin_context(reactor, config) as context:
        plugin = build_plugin(role, getattr(config, role), context)
        try:
            return await use(config, plugin)
        finally:
            if role == "store":
                await plugin.close()


# --- clients ----------------------------------------------------------------


def _check_uris(option: str, uris: list[str]) -> None:
    for uri in uris:
        problem = redirect_uri_problem(uri)
        if problem:
            raise AdminError(f"{option}: {problem}")


def _client_dict(client: Client) -> dict:
    data = asdict(client, recurse=True)
    data["type"] = "public" if client.is_public else "confidential"
    del data["secret_hash"]
    for key in ("redirect_uris", "post_logout_redirect_uris", "resources"):
        data[key] = list(data[key])
    return data


def _print_client(client: Client) -> None:
    for key, value in _client_dict(client).items():
        if isinstance(value, list):
            value = " ".join(value) or "-"
        print(f"{key + ':':<27} {value}")


def _declared(config: Config, client_id: str) -> bool:
    return any(c.client_id == client_id for c in config.clients)


async def client_add(reactor, args):
    problem = client_id_problem(args.client_id)
    if problem:
        raise AdminError(f"client id {problem}")
    _check_uris("--redirect-uri", args.redirect_uri)
    _check_uris("--post-logout-redirect-uri", args.post_logout_redirect_uri)
    if args.backchannel_logout_uri:
        _check_uris("--backchannel-logout-uri", [args.backchannel_logout_uri])
    if args.post_logout_redirect_uri and not args.end_session:
        raise AdminError("--post-logout-redirect-uri needs --end-session")
    secret = None if args.public else new_token(32)

    async def add(config, store):
        if _declared(config, args.client_id):
            raise AdminError(f"client {args.client_id!r} is declared in {config.path}; edit it there")
        client = Client(
            client_id=args.client_id,
            secret_hash=token_hash(secret) if secret else None,
            name=args.name or args.client_id,
            redirect_uris=args.redirect_uri,
            post_logout_redirect_uris=args.post_logout_redirect_uri,
            end_session_enabled=args.end_session,
            first_party=args.first_party,
            resources=args.resource,
            introspect_any=args.introspect_any,
            backchannel_logout_uri=args.backchannel_logout_uri,
            created_at=int(reactor.seconds()),
        )
        try:
            await store.add_client(client)
        except AlreadyExists:
            raise AdminError(f"client {args.client_id!r} exists already") from None
        _print_client(client)

    await _with_plugin(reactor, args, "store", add)
    if secret:
        print(f"client_secret:              {secret}")
        print("Keep the secret now: only its hash is stored, it cannot be shown again.", file=sys.stderr)


async def client_list(reactor, args):
    async def show(config, store):
        clients = await store.list_clients()
        if args.json:
            print(json.dumps([_client_dict(c) for c in clients], indent=2))
            return
        for client in clients:
            kind = "public" if client.is_public else "confidential"
            flags = [f for f, on in (("first-party", client.first_party),
                                     ("end-session", client.end_session_enabled),
                                     ("introspect-any", client.introspect_any)) if on]
            print(f"{client.client_id}\t{kind}\t{','.join(flags) or '-'}\t{client.name}")

    await _with_plugin(reactor, args, "store", show)


async def _get_client(store, client_id: str) -> Client:
    client = await store.get_client(client_id)
    if client is None:
        raise AdminError(f"no client {client_id!r}")
    return client


async def client_show(reactor, args):
    async def show(config, store):
        client = await _get_client(store, args.client_id)
        if args.json:
            print(json.dumps(_client_dict(client), indent=2))
        else:
            _print_client(client)

    await _with_plugin(reactor, args, "store", show)


async def client_remove(reactor, args):
    async def remove(config, store):
        if _declared(config, args.client_id):
            raise AdminError(f"client {args.client_id!r} is declared in {config.path}; remove it there")
        if not await store.remove_client(args.client_id):
            raise AdminError(f"no client {args.client_id!r}")
        print(f"removed client {args.client_id}")

    await _with_plugin(reactor, args, "store", remove)


# --- users and passwords ----------------------------------------------------


def _read_password(args) -> str:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Password again: ") != password:
            raise AdminError("the passwords differ")
    else:
        raise AdminError("no terminal to ask for the password: pipe it in with --password-stdin")
    if not password:
        raise AdminError("the password must not be empty")
    return password


async def hash_password_command(reactor, args):
    from authsrv.identity.passwords import hash_password

    print(hash_password(_read_password(args)))


async def user_add(reactor, args):
    from authsrv.identity.passwords import hash_password
    from authsrv.identity.static import add_user

    config = _config(args)
    static = [c for c in config.identity if c.name == "static"]
    if not static and any(c.name == "postgres" for c in config.identity):
        return await _postgres_user_add(reactor, args)
    if not static:
        raise AdminError("no [[identity]] backend of plugin \"static\" in the config: users live elsewhere")
    _check_profile(args)
    path = static[0].section.path_("path", "users.toml")
    password_hash = hash_password(_read_password(args))
    try:
        user = add_user(
            path,
            login=args.login,
            password_hash=password_hash,
            sub=args.sub,
            name=args.name,
            email=args.email,
            email_verified=args.email_verified,
            picture=args.picture,
            chat_user_id=args.chat_user_id,
        )
    except (ValueError, OSError) as e:
        raise AdminError(f"{path}: {e}") from None
    print(f"added user {user.login} (sub {user.sub}) to {path}")


def _check_profile(args) -> None:
    if args.email and "@" not in args.email:
        raise AdminError(f"--email {args.email!r} is not an email address")
    if args.picture and not args.picture.startswith(("https://", "http://")):
        raise AdminError("--picture must be an http(s) URL")


# --- users in PostgreSQL (identity plugin "postgres", mode "own") -----------


async def _with_own_users(reactor, args, act):
    """Run C{act(backend)} on the configured PostgreSQL identity backend, in own-schema mode."""
    config = _config(args)
    choices = [c for c in config.identity if c.name == "postgres"]
    if not choices:
        raise AdminError("no [[identity]] backend of plugin \"postgres\" in the config: users live elsewhere")
    async with _plugin_context(reactor, config) as context:
        backend = build_plugin("identity", choices[0], context)
        try:
            if backend.mode != "own":
                raise AdminError("the PostgreSQL identity backend maps the operator's own tables: manage users there")
            await act(backend)
        except ValueError as e:
            raise AdminError(str(e)) from None
        finally:
            await backend.close()


async def _postgres_user_add(reactor, args):
    from authsrv.identity.passwords import hash_password

    _check_profile(args)
    user = User(
        sub=args.sub or str(uuid.uuid4()),
        login=args.login,
        name=args.name,
        email=args.email,
        email_verified=args.email_verified,
        picture=args.picture,
        chat_user_id=args.chat_user_id,
    )
    password_hash = hash_password(_read_password(args))

    async def add(backend):
        await backend.add_user(user, password_hash)
        print(f"added user {user.login} (sub {user.sub}) to the PostgreSQL identity backend")

    await _with_own_users(reactor, args, add)


async def user_passwd(reactor, args):
    from authsrv.identity.passwords import hash_password

    password_hash = hash_password(_read_password(args))

    async def change(backend):
        await backend.set_password_hash(args.login, password_hash)
        print(f"password of {args.login} changed")

    await _with_own_users(reactor, args, change)


async def user_disable(reactor, args):
    async def disable(backend):
        await backend.set_disabled(args.login, True, args.reason)
        print(f"disabled {args.login}")

    await _with_own_users(reactor, args, disable)


async def user_enable(reactor, args):
    async def enable(backend):
        await backend.set_disabled(args.login, False)
        print(f"enabled {args.login}")

    await _with_own_users(reactor, args, enable)


# --- bans and grants --------------------------------------------------------


def _until(args, now: int) -> int | None:
    """The end of a ban from --until (ISO 8601) or --for (a duration)."""
    if args.until and args.for_:
        raise AdminError("give --until or --for, not both")
    if args.for_:
        try:
            return now + parse_duration(args.for_)
        except ValueError:
            raise AdminError(f"--for {args.for_!r} is not a duration such as 12h or 7d") from None
    if args.until:
        try:
            moment = datetime.fromisoformat(args.until.replace("Z", "+00:00"))
        except ValueError:
            raise AdminError(f"--until {args.until!r} is not an ISO 8601 time such as 2030-01-31T12:00:00Z") from None
        if moment.tzinfo is None:
            raise AdminError("--until needs a time zone, e.g. 2030-01-31T12:00:00Z")
        until = int(moment.timestamp())
        if until <= now:
            raise AdminError("--until is in the past")
        return until
    return None


async def _with_user(reactor, args, act):
    """Run C{act(store, sub, now)} for the user named by id or login."""
    config = _config(args)
    async with _plugin_context(reactor, config) as context:
        identity = build_identity(config, context)
        store = build_plugin("store", config.store, context)
        try:
            user = await identity.user_by_id(args.user) or await identity.user_by_login(args.user)
            if user is None:
                raise AdminError(f"no user {args.user!r} (by id or login)")
            await act(store, user.sub, int(reactor.seconds()))
        finally:
            await store.close()
            await identity.close()


async def ban(reactor, args):
    async def act(store, sub, now):
        until = _until(args, now)
        await store.ban_user(Ban(sub=sub, reason=args.reason, created_at=now, until=until))
        ended = await store.end_user_sessions(sub)
        events.user_banned(sub=sub, reason=args.reason, until=until, by="operator")
        print(f"banned {sub}" + (f" until {iso_utc(until)}" if until else "")
              + f"; {ended} browser sessions ended")

    await _with_user(reactor, args, act)


async def unban(reactor, args):
    async def act(store, sub, now):
        if not await store.unban_user(sub):
            raise AdminError(f"{sub} is not banned")
        events.user_unbanned(sub=sub, by="operator")
        print(f"unbanned {sub}")

    await _with_user(reactor, args, act)


async def revoke(reactor, args):
    async def act(store, sub, now):
        count = await store.revoke_user_grants(sub, now)
        ended = await store.end_user_sessions(sub)
        events.user_grants_revoked(sub=sub, count=count, by="operator")
        print(f"revoked {count} grants of {sub}; {ended} browser sessions ended")

    await _with_user(reactor, args, act)


async def bans_list(reactor, args):
    async def show(config, store):
        for entry in await store.list_bans(int(reactor.seconds())):
            until = iso_utc(entry.until) if entry.until else "-"
            print(f"{entry.sub}\t{until}\t{entry.reason or '-'}")

    await _with_plugin(reactor, args, "store", show)


# --- keys and config --------------------------------------------------------


def _print_keys(keys) -> None:
    for key in keys:
        print(f"{key.kid}\t{key.alg}\t{key.state}")


async def keys_list(reactor, args):
    async def show(config, keystore):
        _print_keys(keystore.keys())

    await _with_plugin(reactor, args, "keystore", show)


async def keys_rotate(reactor, args):
    async def rotate(config, keystore):
        now = int(reactor.seconds())
        for key in keystore.keys():
            age = now - key.created_at
            if key.state == "next" and age < JWKS_MAX_AGE and not args.force:
                raise AdminError(
                    f"the next {key.alg} key was published {age} s ago, and relying parties"
                    f" cache the JWKS for {JWKS_MAX_AGE} s: rotate in {JWKS_MAX_AGE - age} s,"
                    " or now with --force (tokens it signs may fail to verify meanwhile)"
                )
        _print_keys(await keystore.rotate(now))
        print("rotated: a running server picks the new keys up within a minute", file=sys.stderr)

    await _with_plugin(reactor, args, "keystore", rotate)


async def check_config(reactor, args):
    """
    Everything the server checks at start, plugin sections included, without
    creating or changing any file (the plugins run in check-only mode).
    """
    if args.file:
        args.config = args.file
    config = _config(args)
    tls_problem = config_tls_problem(config, reactor.seconds())
    if tls_problem:
        raise AdminError(f"{config.path}: {tls_problem}")
    async with _plugin_context(reactor, config, check_only=True, prefix=f"{config.path}: ") as context:
        build_plugin("keystore", config.keystore, context)
        for role, choice in [("store", config.store), *(("identity", c) for c in config.identity)]:
            plugin = build_plugin(role, choice, context)
            if plugin is not None:
                await plugin.close()
    print(f"{config.path}: ok (issuer {config.issuer})")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="authsrv-admin", description=__doc__.split("\n\n")[0].strip())
    parser.add_argument(
        "--config", "-c", help=f"the server's config file (default: {DEFAULT_DATA_DIR}/{CONFIG_NAME})"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    client = commands.add_parser("client", help="provision relying parties").add_subparsers(
        dest="client_command", required=True, metavar="ACTION"
    )
    add = client.add_parser("add", help="add a client; prints a generated secret once")
    add.add_argument("client_id")
    add.add_argument("--public", action="store_true", help="no secret: a browser or native app (PKCE only)")
    add.add_argument("--name", help="shown on the consent page")
    add.add_argument("--redirect-uri", action="append", required=True, help="repeat for several")
    add.add_argument("--post-logout-redirect-uri", action="append", default=[])
    add.add_argument("--end-session", action="store_true", help="allow RP-initiated logout")
    add.add_argument("--first-party", action="store_true", help="skip the consent page")
    add.add_argument("--resource", action="append", default=[], help="an audience it may request (RFC 8707)")
    add.add_argument("--introspect-any", action="store_true", help="a resource server that may introspect any token")
    add.add_argument("--backchannel-logout-uri")
    add.set_defaults(run=client_add)
    listing = client.add_parser("list", help="list clients")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(run=client_list)
    show = client.add_parser("show", help="show one client")
    show.add_argument("client_id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(run=client_show)
    remove = client.add_parser("remove", help="remove a client")
    remove.add_argument("client_id")
    remove.set_defaults(run=client_remove)

    user = commands.add_parser("user", help="users of the static users file or of PostgreSQL").add_subparsers(
        dest="user_command", required=True, metavar="ACTION"
    )
    uadd = user.add_parser("add", help="add a user; asks for the password")
    uadd.add_argument("login")
    uadd.add_argument("--sub", help="stable user id (default: a random UUID)")
    uadd.add_argument("--name")
    uadd.add_argument("--email")
    uadd.add_argument("--email-verified", action="store_true")
    uadd.add_argument("--picture", help="URL of a picture")
    uadd.add_argument("--chat-user-id", help="linked chat-platform user id")
    uadd.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    uadd.set_defaults(run=user_add)
    passwd = user.add_parser("passwd", help="PostgreSQL backend: set a user's password; asks for it")
    passwd.add_argument("login")
    passwd.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    passwd.set_defaults(run=user_passwd)
    disable = user.add_parser("disable", help="PostgreSQL backend: disable a user (counts as banned)")
    disable.add_argument("login")
    disable.add_argument("--reason", required=True, help="reported as banReason")
    disable.set_defaults(run=user_disable)
    enable = user.add_parser("enable", help="PostgreSQL backend: enable a disabled user")
    enable.add_argument("login")
    enable.set_defaults(run=user_enable)

    hasher = commands.add_parser("hash-password", help="print an argon2id hash for a users file")
    hasher.add_argument("--password-stdin", action="store_true")
    hasher.set_defaults(run=hash_password_command)

    keys = commands.add_parser("keys", help="signing keys").add_subparsers(
        dest="keys_command", required=True, metavar="ACTION"
    )
    keys.add_parser("list", help="list keys and their states").set_defaults(run=keys_list)
    rotate = keys.add_parser("rotate", help="promote the next key, retire the active one")
    rotate.add_argument("--force", action="store_true", help="even if the next key was published only just now")
    rotate.set_defaults(run=keys_rotate)

    for name, run, help_text in (
        ("ban", ban, "ban a user everywhere at once (ends their browser sessions)"),
        ("unban", unban, "lift a user's ban"),
        ("revoke", revoke, "revoke all of a user's grants and end their browser sessions"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("user", help="the user's id (sub) or login")
        if name == "ban":
            command.add_argument("--reason", required=True, help="reported as banReason")
            command.add_argument("--until", help="an ISO 8601 time, e.g. 2030-01-31T12:00:00Z")
            command.add_argument("--for", dest="for_", metavar="DURATION", help="e.g. 12h or 7d")
        command.set_defaults(run=run)
    commands.add_parser("bans", help="list the bans in force").set_defaults(run=bans_list)

    check = commands.add_parser("check-config", help="validate a config file")
    check.add_argument("file", nargs="?")
    check.set_defaults(run=check_config)
    return parser


def _audit_to_stderr() -> None:
    """The operator's security actions as JSON lines on standard error, like the server's events."""
    audit_only = LogLevelFilterPredicate()
    audit_only.setLogLevelForNamespace("", LogLevel.critical)
    audit_only.setLogLevelForNamespace(events.log.namespace, LogLevel.info)
    globalLogBeginner.beginLoggingTo(
        [FilteringLogObserver(jsonFileLogObserver(sys.stderr, recordSeparator=""), [audit_only])],
        redirectStandardIO=False,
    )


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    _audit_to_stderr()

    async def run(reactor):
        try:
            await args.run(reactor, args)
        except AdminError as e:
            print(f"authsrv-admin: {e}", file=sys.stderr)
            raise SystemExit(1)

    react(lambda reactor: Deferred.fromCoroutine(run(reactor)))
