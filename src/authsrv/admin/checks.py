"""
C{authsrv-admin check-config}: validate a config file as the server would,
reporting every problem at once, one line each.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import psycopg2
from twisted.cred.error import UnauthorizedLogin
from twisted.internet.threads import deferToThreadPool

from authsrv.admin.common import AdminError, AdminProblems, Console, config_path, plugin_context
from authsrv.config import Config, ConfigFileError, read_config_document, read_toml
from authsrv.configsection import ConfigError
from authsrv.identity.errors import BackendUnavailable
from authsrv.identity.ldap.config import settings_from_config
from authsrv.identity.ldap.directory import Directory, close_connection
from authsrv.pg.pool import first_line
from authsrv.pg.settings import read_settings
from authsrv.service import StartupError, build_plugin
from authsrv.tls import config_listen_problems


def _plugin_choices(config: Config):
    return [("keystore", config.keystore), ("store", config.store), *(("identity", c) for c in config.identity)]


async def _plugin_problems(reactor, config: Config) -> list[str]:
    """
    Each plugin section's first problem, the files it names included (users
    file, key files), checked without creating or changing any file (the
    plugins run in check-only mode).
    """
    problems = []
    async with plugin_context(reactor, config, check_only=True) as context:
        for role, choice in _plugin_choices(config):
            try:
                plugin = build_plugin(role, choice, context)
            except StartupError as e:
                problems.append(str(e))
                continue
            if plugin is not None:
                await plugin.close()
    return problems


def _postgres_problem(section) -> str | None:
    settings = read_settings(section, "authsrv-admin")
    try:
        with closing(settings.connect(read_only=True)):
            return None
    except psycopg2.Error as e:
        return f"{settings.key}: cannot connect: {first_line(e)}"


def _ldap_problem(section) -> str | None:
    settings = settings_from_config(section)
    password = settings.bind_password.encode("utf-8") if settings.bind_password else None
    try:
        close_connection(Directory(settings).open(settings.bind_dn, password, settings.bind_timeout))
    except BackendUnavailable as e:
        return f"{section.key('urls')}: {e}"
    except UnauthorizedLogin as e:
        return f"{section.key('bind_dn')}: {e}"
    return None


REACHABILITY = {"postgres": _postgres_problem, "ldap": _ldap_problem}
"""The plugins that talk to a server, and how to see whether it answers."""


async def _reachability_problems(reactor, document: dict, path: Path) -> list[str]:
    """
    C{--online}: connect to each PostgreSQL database and LDAP directory the
    config names (read-only, changing nothing) and say which cannot be
    reached. The document is read again for sections nobody has taken keys
    from; sections with mistakes are left to the offline checks.
    """
    config, _ = read_config_document(document, path)
    problems = []
    for _, choice in _plugin_choices(config):
        check = REACHABILITY.get(choice.name)
        if check is None:
            continue
        try:
            problem = await deferToThreadPool(reactor, reactor.getThreadPool(), check, choice.section)
        except ConfigError:
            continue
        if problem:
            problems.append(problem)
    return problems


async def check_config(reactor, args, console: Console):
    """
    Everything the server checks at start, and the files the config names,
    each problem on its own line; with C{--online}, the servers too.
    """
    if args.file:
        args.config = args.file
    path = config_path(args)
    try:
        document = read_toml(path)
    except ConfigFileError as e:
        raise AdminError(str(e)) from None
    config, errors = read_config_document(document, path.resolve())
    problems = [str(e) for e in errors]
    problems += config_listen_problems(config, reactor, reactor.seconds())
    problems += await _plugin_problems(reactor, config)
    if args.online:
        problems += await _reachability_problems(reactor, document, path.resolve())
    if problems:
        raise AdminProblems([f"{path}: {problem}" for problem in problems])
    console.out(f"{path}: ok (issuer {config.issuer})")


def register(commands) -> None:
    """Add C{check-config} to the top-level subparsers."""
    check = commands.add_parser("check-config", help="validate a config file, reporting every problem")
    check.add_argument("file", nargs="?")
    check.add_argument(
        "--online", action="store_true", help="also connect to the PostgreSQL databases and LDAP directories"
    )
    check.set_defaults(run=check_config)
