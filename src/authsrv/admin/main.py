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
from pathlib import Path

from attrs import asdict
from twisted.internet.defer import Deferred
from twisted.internet.task import react

from authsrv.config import Config, ConfigFileError, load_config
from authsrv.context import PluginContext
from authsrv.embedded import CONFIG_NAME, DEFAULT_DATA_DIR
from authsrv.protocol.clients import client_id_problem, redirect_uri_problem
from authsrv.records import Client
from authsrv.service import JWKS_MAX_AGE, StartupError, build_plugin
from authsrv.store.errors import AlreadyExists
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


async def _with_plugin(reactor, args, role: str, use):
    config = _config(args)
    context = PluginContext(reactor, config.base_dir, config.limits.max_token_lifetime)
    try:
        plugin = build_plugin(role, getattr(config, role), context)
        try:
            return await use(config, plugin)
        finally:
            if role == "store":
                await plugin.close()
    except StartupError as e:
        raise AdminError(str(e)) from None
    finally:
        context.stop()


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
    if not static:
        raise AdminError("no [[identity]] backend of plugin \"static\" in the config: users live elsewhere")
    if args.email and "@" not in args.email:
        raise AdminError(f"--email {args.email!r} is not an email address")
    if args.picture and not args.picture.startswith(("https://", "http://")):
        raise AdminError("--picture must be an http(s) URL")
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
    context = PluginContext(reactor, config.base_dir, config.limits.max_token_lifetime, check_only=True)
    try:
        build_plugin("keystore", config.keystore, context)
        for role, choice in [("store", config.store), *(("identity", c) for c in config.identity)]:
            plugin = build_plugin(role, choice, context)
            if plugin is not None:
                await plugin.close()
    except StartupError as e:
        raise AdminError(f"{config.path}: {e}") from None
    finally:
        context.stop()
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

    user = commands.add_parser("user", help="users of the static users file").add_subparsers(
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

    check = commands.add_parser("check-config", help="validate a config file")
    check.add_argument("file", nargs="?")
    check.set_defaults(run=check_config)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)

    async def run(reactor):
        try:
            await args.run(reactor, args)
        except AdminError as e:
            print(f"authsrv-admin: {e}", file=sys.stderr)
            raise SystemExit(1)

    react(lambda reactor: Deferred.fromCoroutine(run(reactor)))
