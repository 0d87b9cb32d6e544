"""C{authsrv-admin keys ...}: the signing keys of the configured keystore, through L{authsrv.operations.keys}."""

from __future__ import annotations

from attrs import asdict

from authsrv.admin.common import ACTOR, AdminError, Console, with_plugin
from authsrv.operations.errors import Conflict
from authsrv.operations.keys import ADOPTED, KeyOperations
from authsrv.records import Rotation


def _print_keys(keys, args, console: Console) -> None:
    if args.json:
        console.out_json([asdict(key) for key in keys])
        return
    for key in keys:
        console.out(f"{key.kid}\t{key.alg}\t{key.state}")


def _rotation_outcome(rotation: Rotation) -> str:
    """Told on stderr, so that --json output stays the bare key list."""
    if rotation.rotated:
        return "rotated: a running server picks the new keys up within a minute"
    return ADOPTED


async def keys_list(reactor, args, console: Console):
    async def show(config, keystore):
        _print_keys(KeyOperations(keystore=keystore, clock=reactor).keys(), args, console)

    await with_plugin(reactor, args, "keystore", show)


async def keys_rotate(reactor, args, console: Console):
    async def rotate(config, keystore):
        try:
            rotation = await KeyOperations(keystore=keystore, clock=reactor).rotate(actor=ACTOR, force=args.force)
        except Conflict as e:
            raise AdminError(e.message.replace("with force", "with --force")) from None
        _print_keys(rotation.keys, args, console)
        console.err(_rotation_outcome(rotation))

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
