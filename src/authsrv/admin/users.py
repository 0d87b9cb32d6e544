"""
C{authsrv-admin user ...} and C{hash-password}: users of the first
configured identity backend that can write them (L{IUserManagement}).
Every new password meets L{authsrv.protocol.password_policy}; the ones
users have already are left alone.
"""

from __future__ import annotations

import uuid

from attrs import asdict

from authsrv.admin.common import AdminError, Console, config_of, plugin_context, read_password
from authsrv.config import Config
from authsrv.identity.passwords import hash_password
from authsrv.interfaces import IUserManagement
from authsrv.protocol.password_policy import MIN_LENGTH, password_problem
from authsrv.records import User
from authsrv.service import build_plugin

NO_WRITABLE_BACKEND = (
    "no [[identity]] backend in the config can write users (a static users file, or PostgreSQL"
    ' in mode "own"): users live elsewhere, manage them there'
)


async def _with_user_management(reactor, args, act):
    """
    Run C{act(config, backend)} on the first configured identity backend
    that provides L{IUserManagement}; the ones before it are closed unused.
    """
    config = config_of(args)
    async with plugin_context(reactor, config) as context:
        for choice in config.identity:
            backend = build_plugin("identity", choice, context)
            if IUserManagement.providedBy(backend):
                break
            await backend.close()
        else:
            raise AdminError(NO_WRITABLE_BACKEND)
        try:
            await act(config, backend)
        except (ValueError, OSError) as e:
            raise AdminError(str(e)) from None
        finally:
            await backend.close()


def _check_profile(args) -> None:
    if args.email and "@" not in args.email:
        raise AdminError(f"--email {args.email!r} is not an email address")
    if args.picture and not args.picture.startswith(("https://", "http://")):
        raise AdminError("--picture must be an http(s) URL")


def _new_password_hash(args, console: Console, user: User | None, min_length: int) -> str:
    """The hash of a new password read as C{read_password} does, once it meets the policy."""
    password = read_password(args, console)
    problem = password_problem(
        password, login=user.login if user else None, email=user.email if user else None, min_length=min_length
    )
    if problem:
        raise AdminError(problem)
    return hash_password(password)


async def _existing_user(backend, login: str) -> User:
    user = await backend.user_by_login(login)
    if user is None:
        raise AdminError(f"no user with login {login!r} in {backend.users_location}")
    return user


async def hash_password_command(reactor, args, console: Console):
    min_length = config_of(args).password_min_length if args.config else MIN_LENGTH
    console.out(_new_password_hash(args, console, None, min_length))


async def user_add(reactor, args, console: Console):
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

    async def add(config: Config, backend):
        existing = await backend.user_by_login(user.login)
        if existing is not None:
            raise AdminError(f"login {existing.login!r} is already taken in {backend.users_location}")
        password_hash = _new_password_hash(args, console, user, config.password_min_length)
        added = await backend.add_user(user, password_hash)
        console.out(f"added user {added.login} (sub {added.sub}) to {backend.users_location}")

    await _with_user_management(reactor, args, add)


async def user_passwd(reactor, args, console: Console):
    async def change(config: Config, backend):
        user = await _existing_user(backend, args.login)
        await backend.set_password_hash(
            args.login, _new_password_hash(args, console, user, config.password_min_length)
        )
        console.out(f"password of {args.login} changed")

    await _with_user_management(reactor, args, change)


async def user_disable(reactor, args, console: Console):
    async def disable(config: Config, backend):
        await backend.set_disabled(args.login, True, args.reason)
        console.out(f"disabled {args.login}")

    await _with_user_management(reactor, args, disable)


async def user_enable(reactor, args, console: Console):
    async def enable(config: Config, backend):
        await backend.set_disabled(args.login, False)
        console.out(f"enabled {args.login}")

    await _with_user_management(reactor, args, enable)


async def user_remove(reactor, args, console: Console):
    async def remove(config: Config, backend):
        await backend.remove_user(args.login)
        console.out(f"removed user {args.login} from {backend.users_location}")

    await _with_user_management(reactor, args, remove)


async def user_list(reactor, args, console: Console):
    async def show(config: Config, backend):
        users = await backend.list_users()
        if args.json:
            console.out_json([asdict(u) for u in users])
            return
        for user in users:
            state = "disabled" if user.disabled else "enabled"
            console.out(f"{user.login}\t{user.sub}\t{state}\t{user.name or '-'}")

    await _with_user_management(reactor, args, show)


async def user_show(reactor, args, console: Console):
    async def show(config: Config, backend):
        user = await _existing_user(backend, args.login)
        if args.json:
            console.out_json(asdict(user))
            return
        for key, value in asdict(user).items():
            console.out(f"{key + ':':<16} {'-' if value is None else value}")

    await _with_user_management(reactor, args, show)


def register(commands) -> None:
    """Add C{user add|passwd|disable|enable|remove|list|show} and C{hash-password} to the top-level subparsers."""
    user = commands.add_parser("user", help="users of the static users file or of PostgreSQL").add_subparsers(
        dest="user_command", required=True, metavar="ACTION"
    )
    add = user.add_parser("add", help="add a user; asks for the password")
    add.add_argument("login")
    add.add_argument("--sub", help="stable user id (default: a random UUID)")
    add.add_argument("--name")
    add.add_argument("--email")
    add.add_argument("--email-verified", action="store_true")
    add.add_argument("--picture", help="URL of a picture")
    add.add_argument("--chat-user-id", help="linked chat-platform user id")
    add.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    add.set_defaults(run=user_add)
    passwd = user.add_parser("passwd", help="set a user's password; asks for it")
    passwd.add_argument("login")
    passwd.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    passwd.set_defaults(run=user_passwd)
    disable = user.add_parser("disable", help="disable a user (counts as banned)")
    disable.add_argument("login")
    disable.add_argument("--reason", required=True, help="reported as banReason")
    disable.set_defaults(run=user_disable)
    enable = user.add_parser("enable", help="enable a disabled user")
    enable.add_argument("login")
    enable.set_defaults(run=user_enable)
    remove = user.add_parser("remove", help="remove a user and their password")
    remove.add_argument("login")
    remove.set_defaults(run=user_remove)
    user.add_parser("list", help="list users, ordered by login").set_defaults(run=user_list)
    show = user.add_parser("show", help="show one user")
    show.add_argument("login")
    show.set_defaults(run=user_show)

    hasher = commands.add_parser("hash-password", help="print an argon2id hash for a users file")
    hasher.add_argument("--password-stdin", action="store_true")
    hasher.set_defaults(run=hash_password_command)
