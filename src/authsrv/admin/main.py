"""
C{authsrv-admin}: the operator command.

It works on the same config file, store and keystore as the server, from a
separate process: the server picks up clients at once (it reads them from the
store), and keys and users within a minute (it re-reads changed files).
Secrets are printed once and stored only hashed; passwords are read from the
terminal or standard input, never from arguments.

This module parses the command line and dispatches; each command group
lives in its own module. L{run} runs one command on a given reactor and
streams, as tests do in their own process; L{main} is the installed script.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from importlib.metadata import version

from twisted.internet.defer import Deferred
from twisted.internet.task import react
from twisted.logger import globalLogBeginner, globalLogPublisher

from authsrv.admin import bans, checks, clients, imports, keys, users
from authsrv.admin.common import (
    EXIT_OK,
    EXIT_SOFTWARE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    AdminError,
    Console,
    config_of,
)
from authsrv.auditlog import AuditObserver
from authsrv.embedded import CONFIG_NAME, DEFAULT_DATA_DIR
from authsrv.identity.errors import BackendUnavailable
from authsrv.keys.postgres import KeystoreUnavailable
from authsrv.logfile import STDOUT, LineFile
from authsrv.store.errors import StoreUnavailable


DESCRIPTION = (
    "authsrv-admin: the operator command. It works on the same config file, store and keystore"
    " as the server, whether the server is running or not."
)
"""What C{--help} says first: plain text, not the module docstring's markup."""

UNREACHABLE = (StoreUnavailable, KeystoreUnavailable, BackendUnavailable)
"""What the plugins raise when their server does not answer while a command runs."""

DEBUG_ENV = "AUTHSRV_ADMIN_DEBUG"
"""Set to 1, an unexpected failure also prints its traceback, which may quote config values."""


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """C{--config} and C{--json}, with their defaults on the top level only."""
    parser.add_argument(
        "--config", "-c", default=None if top else argparse.SUPPRESS,
        help=f"the server's config file (default: {DEFAULT_DATA_DIR}/{CONFIG_NAME})",
    )
    parser.add_argument(
        "--json", action="store_true", default=False if top else argparse.SUPPRESS,
        help="print lists, records and check-config's report as one JSON document, for scripts",
    )


def _subcommands(parser: argparse.ArgumentParser):
    """Every parser below C{parser}, at any depth."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield sub
                yield from _subcommands(sub)


def _parser() -> argparse.ArgumentParser:
    """
    The command line. The global options are accepted before or after the
    subcommand: each subcommand takes them too, with no default of its own,
    so that one given earlier is not reset.
    """
    parser = argparse.ArgumentParser(
        prog="authsrv-admin", description=DESCRIPTION, allow_abbrev=False
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('authsrv')}")
    _global_options(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (clients, users, keys, bans, checks, imports):
        group.register(commands)
    for sub in _subcommands(parser):
        _global_options(sub, top=False)
    return parser


def _audit_observer(args, stderr) -> AuditObserver:
    """
    The operator's security actions as the server's audit lines: into the
    config's C{[audit] path} when it names a file, else on standard error
    (standard output is the command's own).
    """
    try:
        path = config_of(args).audit_path
    except AdminError:
        path = None
    if path is None or path == STDOUT:
        return AuditObserver(stderr)
    try:
        return AuditObserver(LineFile(path))
    except OSError as e:
        raise AdminError(f"audit.path: cannot open {path}: {e.strerror}") from None


async def run(argv: list[str], reactor, *, stdin=None, stdout=None, stderr=None) -> int:
    """
    Run one command line on C{reactor}, talking to the given streams (the
    process's by default); returns the exit status: 0, 1 for an
    L{AdminError} (one line on standard error for each problem), 2 for a
    usage mistake, 69 when the store, keystore or an identity backend did
    not answer, 70 for an unexpected failure (a bug: one line, and the
    traceback with L{DEBUG_ENV}). The audit events go to the audit log, or
    standard error, while the command runs.
    """
    console = Console(stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr)
    try:
        return await _run(argv, reactor, console)
    except Exception as e:
        _report_bug(e, console)
        return EXIT_SOFTWARE


def _report_bug(error: Exception, console: Console) -> None:
    """
    One line an operator can report, never silence: the failure would
    otherwise go to a log nobody reads.
    """
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if debug:
        traceback.print_exception(error, file=console.stderr)
    hint = "" if debug else f" ({DEBUG_ENV}=1 shows the traceback)"
    console.err(f"authsrv-admin: unexpected error: {_safe_description(error)}; this is a bug, please report it"
                f" with the command you ran{hint}")


def _safe_description(error: Exception) -> str:
    """
    The failure's type, the C library's text of an L{OSError}, and where it
    was raised: never the message itself, which may quote a config value or
    a password.
    """
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = f"{name}: {error.strerror}" if isinstance(error, OSError) and error.strerror else name
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    if frame is None:
        return text
    return f"{text} (at {frame.tb_frame.f_globals.get('__name__', '?')}:{frame.tb_lineno})"


async def _run(argv: list[str], reactor, console: Console) -> int:
    """L{run}, but for its unexpected failures."""
    try:
        with redirect_stdout(console.stdout), redirect_stderr(console.stderr):
            args = _parser().parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        observer = _audit_observer(args, console.stderr)
    except AdminError as e:
        console.err(f"authsrv-admin: {e}")
        return e.status
    globalLogPublisher.addObserver(observer)
    try:
        await args.run(reactor, args, console)
    except AdminError as e:
        for line in e.lines:
            console.err(f"authsrv-admin: {line}")
        return e.status
    except UNREACHABLE as e:
        console.err(f"authsrv-admin: {e} (try again once it answers)")
        return EXIT_UNAVAILABLE
    finally:
        globalLogPublisher.removeObserver(observer)
        if isinstance(observer.file, LineFile):
            observer.file.close()
    return EXIT_OK


def main(argv: list[str] | None = None) -> None:
    # Python warnings go into the log, where run()'s filter keeps them off
    # the operator's screen.
    globalLogBeginner.beginLoggingTo([], redirectStandardIO=False)

    async def command(reactor):
        status = await run(sys.argv[1:] if argv is None else argv, reactor)
        if status:
            raise SystemExit(status)

    react(lambda reactor: Deferred.fromCoroutine(command(reactor)))
