"""
C{authsrv-admin user ...} and C{hash-password}: users of the first
configured identity backend that can write them (L{IUserManagement}), and
C{user reset-factors}, which works with any backend since factors live in
authsrv's own store.
"""

from __future__ import annotations

import uuid

from authsrv.admin.common import AdminError, Console, config_of, plugin_context, read_password
from authsrv.flows.mfa import reset_factors
from authsrv.identity.passwords import hash_password
from authsrv.interfaces import IUserManagement
from authsrv.records import User
from authsrv.service import build_identity, build_plugin

NO_WRITABLE_BACKEND = (
    "no [[identity]] backend in the config can write users (a static users file, or PostgreSQL"
    ' in mode "own"): users live elsewhere, manage them there'
)


async def _with_user_management(reactor, args, act):
    """
    Run C{act(backend)} on the first configured identity backend that
    provides L{IUserManagement}; the ones before it are closed unused.
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
            await act(backend)
        except (ValueError, OSError) as e:
            raise AdminError(str(e)) from None
        finally:
            await backend.close()


def _check_profile(args) -> None:
    if args.email and "@" not in args.email:
        raise AdminError(f"--email {args.email!r} is not an email address")
    if args.picture and not args.picture.startswith(("https://", "http://")):
        raise AdminError("--picture must be an http(s) URL")


async def hash_password_command(reactor, args, console: Console):
    console.out(hash_password(read_password(args, console)))


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

    async def add(backend):
        password_hash = hash_password(read_password(args, console))
        added = await backend.add_user(user, password_hash)
        console.out(f"added user {added.login} (sub {added.sub}) to {backend.users_location}")

    await _with_user_management(reactor, args, add)


async def user_passwd(reactor, args, console: Console):
    async def change(backend):
        await backend.set_password_hash(args.login, hash_password(read_password(args, console)))
        console.out(f"password of {args.login} changed")

    await _with_user_management(reactor, args, change)


async def user_disable(reactor, args, console: Console):
    async def disable(backend):
        await backend.set_disabled(args.login, True, args.reason)
        console.out(f"disabled {args.login}")

    await _with_user_management(reactor, args, disable)


async def user_enable(reactor, args, console: Console):
    async def enable(backend):
        await backend.set_disabled(args.login, False)
        console.out(f"enabled {args.login}")

    await _with_user_management(reactor, args, enable)


async def user_reset_factors(reactor, args, console: Console):
    """Remove a user's second factors (a lost phone); named by id or login in any identity backend."""
    config = config_of(args)
    async with plugin_context(reactor, config) as context:
        identity = build_identity(config, context)
        store = build_plugin("store", config.store, context)
        try:
            user = await identity.user_by_id(args.user) or await identity.user_by_login(args.user)
            if user is None:
                raise AdminError(f"no user {args.user!r} (by id or login)")
            if await reset_factors(store, user.sub, by="operator"):
                console.out(f"second factors of {user.login} (sub {user.sub}) removed; they enrol again at sign-in")
            else:
                console.out(f"{user.login} (sub {user.sub}) had no second factors")
        finally:
            await store.close()
            await identity.close()


def register(commands) -> None:
    """Add C{user add|passwd|disable|enable} and C{hash-password} to the top-level subparsers."""
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
    reset = user.add_parser("reset-factors", help="remove a user's second factors (TOTP, recovery codes)")
    reset.add_argument("user", help="the user's id or login")
    reset.set_defaults(run=user_reset_factors)

    hasher = commands.add_parser("hash-password", help="print an argon2id hash for a users file")
    hasher.add_argument("--password-stdin", action="store_true")
    hasher.set_defaults(run=hash_password_command)
