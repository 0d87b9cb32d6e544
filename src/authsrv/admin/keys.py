"""C{authsrv-admin keys ...}: the signing keys of the configured keystore."""

from __future__ import annotations

from attrs import asdict

from authsrv.admin.common import AdminError, Console, with_plugin
from authsrv.service import JWKS_MAX_AGE


def _print_keys(keys, args, console: Console) -> None:
    if args.json:
        console.out_json([asdict(key) for key in keys])
        return
    for key in keys:
        console.out(f"{key.kid}\t{key.alg}\t{key.state}")


async def keys_list(reactor, args, console: Console):
    async def show(config, keystore):
        _print_keys(keystore.keys(), args, console)

    await with_plugin(reactor, args, "keystore", show)


async def keys_rotate(reactor, args, console: Console):
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
        _print_keys(await keystore.rotate(now), args, console)
        console.err("rotated: a running server picks the new keys up within a minute")

    await with_plugin(reactor, args, "keystore", rotate)


def register(commands) -> None:
    """Add C{keys list|rotate} to the top-level subparsers."""
    keys = commands.add_parser("keys", help="signing keys").add_subparsers(
        dest="keys_command", required=True, metavar="ACTION"
    )
    keys.add_parser("list", help="list keys and their states").set_defaults(run=keys_list)
    rotate = keys.add_parser("rotate", help="promote the next key, retire the active one")
    rotate.add_argument("--force", action="store_true", help="even if the next key was published only just now")
    rotate.set_defaults(run=keys_rotate)
