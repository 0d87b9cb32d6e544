"""C{authsrv-admin check-config}: validate a config file as the server would."""

from __future__ import annotations

from authsrv.admin.common import AdminError, Console, config_of, plugin_context
from authsrv.service import build_plugin
from authsrv.tls import config_tls_problem


async def check_config(reactor, args, console: Console):
    """
    Everything the server checks at start, plugin sections included, without
    creating or changing any file (the plugins run in check-only mode).
    """
    if args.file:
        args.config = args.file
    config = config_of(args)
    tls_problem = config_tls_problem(config, reactor.seconds())
    if tls_problem:
        raise AdminError(f"{config.path}: {tls_problem}")
    async with plugin_context(reactor, config, check_only=True, prefix=f"{config.path}: ") as context:
        build_plugin("keystore", config.keystore, context)
        for role, choice in [("store", config.store), *(("identity", c) for c in config.identity)]:
            plugin = build_plugin(role, choice, context)
            if plugin is not None:
                await plugin.close()
    console.out(f"{config.path}: ok (issuer {config.issuer})")


def register(commands) -> None:
    """Add C{check-config} to the top-level subparsers."""
    check = commands.add_parser("check-config", help="validate a config file")
    check.add_argument("file", nargs="?")
    check.set_defaults(run=check_config)
