"""
What every C{authsrv-admin} command uses: its error type, the streams it
talks to, the config file and the context it builds plugins in.
"""

from __future__ import annotations

import getpass
import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TextIO

from attrs import frozen
from twisted.internet.defer import Deferred, DeferredList

from authsrv.config import Config, ConfigFileError, load_config
from authsrv.context import PluginContext
from authsrv.embedded import CONFIG_NAME, DEFAULT_DATA_DIR
from authsrv.operations.errors import OperationError
from authsrv.service import (
    StartupError,
    StartupUnreachable,
    backchannel_notifier,
    build_identity,
    build_plugin,
    chat_parts,
    user_operations,
)

ACTOR = "operator"
"""The C{actor} of this command's audit events."""

EXIT_OK = 0
EXIT_FAILED = 1
"""The operation was refused or failed: bad input, nothing found, a problem in the config."""
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69
"""
The store, keystore or identity backend did not answer (sysexits'
C{EX_UNAVAILABLE}): nothing was done, and the same command may work later.
"""
EXIT_SOFTWARE = 70
"""An unexpected failure: a bug in the command (sysexits' C{EX_SOFTWARE}), not the operator's mistake."""


class AdminError(Exception):
    """A mistake the operator can fix; printed as one line, exit status 1."""

    status = EXIT_FAILED

    @property
    def lines(self) -> tuple[str, ...]:
        return (str(self),)


class AdminUnavailable(AdminError):
    """A database or directory the command needs did not answer; exit status 69."""

    status = EXIT_UNAVAILABLE


class Reported(AdminError):
    """A failure the command has already reported on standard output (C{--json}): exit status 1, nothing more."""

    @property
    def lines(self) -> tuple[str, ...]:
        return ()


class AdminProblems(AdminError):
    """Several mistakes found at once (C{check-config}): one line each, exit status 1."""

    def __init__(self, problems: list[str]):
        super().__init__(problems[0])
        self.problems = tuple(problems)

    @property
    def lines(self) -> tuple[str, ...]:
        return self.problems


@frozen
class Console:
    """
    The streams of one command: the process's own when run as
    C{authsrv-admin}, a test's when run in its process.
    """

    stdin: TextIO
    stdout: TextIO
    stderr: TextIO

    def out(self, text: str) -> None:
        print(text, file=self.stdout)

    def err(self, text: str) -> None:
        print(text, file=self.stderr)

    def out_json(self, value) -> None:
        """C{value} as one JSON document (C{--json}): the same keys every time, for scripts."""
        print(json.dumps(value, indent=2, ensure_ascii=False), file=self.stdout)


def config_path(args) -> Path:
    """The config file named by C{--config}, or the default data folder's when it exists."""
    path = Path(args.config) if args.config else Path(DEFAULT_DATA_DIR) / CONFIG_NAME
    if not args.config and not path.exists():
        raise AdminError(
            f"no config file: pass --config FILE (or start `twist authsrv` once to create {path})"
        )
    return path


def config_of(args) -> Config:
    """The config file named by C{--config}, or the default data folder's."""
    path = config_path(args)
    try:
        return load_config(path)
    except ConfigFileError as e:
        raise AdminError(str(e)) from None


@asynccontextmanager
async def plugin_context(reactor, config: Config, *, check_only: bool = False, prefix: str = ""):
    """
    The context one command builds plugins in: its thread pools stop with
    the command, and a plugin's start-up problem is one line.
    """
    context = PluginContext.of(reactor, config, check_only=check_only)
    try:
        yield context
    except StartupUnreachable as e:
        raise AdminUnavailable(f"{prefix}{e}") from None
    except StartupError as e:
        raise AdminError(f"{prefix}{e}") from None
    except OperationError as e:
        raise AdminError(e.message) from None
    finally:
        context.stop()


async def with_plugin(reactor, args, role: str, use):
    """C{use(config, plugin)} with the configured plugin of C{role}, closed after."""
    config = config_of(args)
    async with plugin_context(reactor, config) as context:
        plugin = build_plugin(role, getattr(config, role), context)
        try:
            return await use(config, plugin)
        finally:
            if role == "store":
                await plugin.close()


async def with_plugins(reactor, args, use):
    """
    C{use(config, context, store, keystore, identity)} with every configured
    plugin (the identity backends as one chain), closed after.
    """
    config = config_of(args)
    async with plugin_context(reactor, config) as context:
        identity = build_identity(config, context)
        store = build_plugin("store", config.store, context)
        keystore = build_plugin("keystore", config.keystore, context)
        try:
            return await use(config, context, store, keystore, identity)
        finally:
            await store.close()
            await identity.close()


async def with_user_operations(reactor, args, act):
    """
    C{act(operations)} with the user operations over every configured
    plugin; the command ends once the back-channel logouts and chat-token
    revocations it started have (each is bounded by its retries and
    timeouts, and never fails).
    """

    async def use(config, context, store, keystore, identity):
        notifier = backchannel_notifier(reactor)
        linking = chat_parts(config, reactor, store, identity, context).linking
        revocations: list[Deferred] = []
        revoke = (lambda linked: revocations.append(linking.revoke_removed(linked))) if linking else None
        try:
            return await act(user_operations(config, reactor, store, keystore, identity, context, notifier, revoke))
        finally:
            await notifier.settle()
            await DeferredList(revocations)

    return await with_plugins(reactor, args, use)


def read_password(args, console: Console) -> str:
    """A new password from standard input (C{--password-stdin}) or, asked twice, the terminal."""
    if args.password_stdin:
        password = console.stdin.readline().rstrip("\r\n")
    elif console.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Password again: ") != password:
            raise AdminError("the passwords differ")
    else:
        raise AdminError("no terminal to ask for the password: pipe it in with --password-stdin")
    if not password:
        raise AdminError("the password must not be empty")
    return password
