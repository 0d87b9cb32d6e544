"""
C{authsrv-admin check-config}: validate a config file as the server would,
reporting every problem at once, one line each, or with C{--json} one
document naming each problem's key.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import psycopg2
from twisted.cred.error import UnauthorizedLogin
from twisted.internet.threads import deferToThreadPool

from authsrv.admin.common import AdminError, AdminProblems, Console, Reported, config_path, plugin_context
from authsrv.config import Config, ConfigFileError, read_config_document, read_toml
from authsrv.configsection import ConfigError
from authsrv.identity.errors import BackendUnavailable
from authsrv.identity.ldap.config import settings_from_config
from authsrv.identity.ldap.directory import Directory, close_connection
from authsrv.logfile import STDOUT, open_problem
from authsrv.pg.pool import first_line
from authsrv.pg.settings import read_settings
from authsrv.service import StartupError, build_plugin, listener_groups
from authsrv.tls import config_listen_problems, shared_port_problems


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


def _log_file_problems(config: Config) -> list[str]:
    """The audit and access log files the server would fail to open at start, named as it names them."""
    files = [("audit.path", config.audit_path or STDOUT)]
    if config.access_log != "off":
        files.append(("server.access_log_path", config.access_log_path))
    return [f"{key}: cannot open {path}: {problem}" for key, path in files if (problem := open_problem(path))]


CHECKS = ("file", "listeners", "plugins")
"""
What C{check-config} always checks: the file's keys, the secrets it
names and the log files it would open; each listen string and its TLS files; each plugin section and the
files it names. C{--online} adds C{servers}.
"""


async def _problems(reactor, path: Path, online: bool) -> tuple[Config | None, list[str]]:
    """The config read from C{path} (None when it is not TOML) and each of its problems, one line each."""
    try:
        document = read_toml(path)
    except ConfigFileError as e:
        return None, [str(e)]
    config, errors = read_config_document(document, path.resolve())
    problems = [str(e) for e in errors]
    problems += config_listen_problems(config, reactor, reactor.seconds())
    shared, own = listener_groups(config)
    problems += shared_port_problems(shared + own)
    problems += _log_file_problems(config)
    problems += await _plugin_problems(reactor, config)
    if online:
        problems += await _reachability_problems(reactor, document, path.resolve())
    return config, problems


def _entry(problem: str) -> dict:
    """One problem as C{--json} gives it: the dotted key it starts with (None if none), and what is wrong."""
    key, separator, rest = problem.partition(": ")
    if not separator or " " in key:
        return {"key": None, "problem": problem}
    return {"key": key, "problem": rest}


def _report(path: Path, online: bool, config: Config | None, problems: list[str]) -> dict:
    """The C{--json} document; a file that is not TOML was checked no further, and its problem has no key."""
    if config is None:
        return {"file": str(path), "ok": False, "issuer": None, "checked": ["file"],
                "problems": [{"key": None, "problem": problem} for problem in problems]}
    return {
        "file": str(path),
        "ok": not problems,
        "issuer": None if problems else config.issuer,
        "checked": [*CHECKS, "servers"] if online else list(CHECKS),
        "problems": [_entry(problem) for problem in problems],
    }


async def check_config(reactor, args, console: Console):
    """
    Everything the server checks at start, and the files the config names,
    each problem on its own line; with C{--online}, the servers too; with
    C{--json}, one document on standard output, and still exit status 1
    when there are problems.
    """
    if args.file:
        args.config = args.file
    path = config_path(args)
    config, problems = await _problems(reactor, path, args.online)
    if args.json:
        console.out_json(_report(path, args.online, config, problems))
        if problems:
            raise Reported(f"{path}: {len(problems)} problems")
        return
    if config is None:
        raise AdminError(problems[0])
    if problems:
        raise AdminProblems([f"{path}: {problem}" for problem in problems])
    console.out(f"{path}: ok (issuer {config.issuer})")


def register(commands) -> None:
    """Add C{check-config} to the top-level subparsers."""
    check = commands.add_parser("check-config", help="validate a config file, reporting every problem")
    check.add_argument("file", nargs="?", help="the config file to check (default: the one --config names)")
    check.add_argument(
        "--online", action="store_true", help="also connect to the PostgreSQL databases and LDAP directories"
    )
    check.set_defaults(run=check_config)
