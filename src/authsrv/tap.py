"""
C{twist authsrv}: command-line options and the service maker.
"""

from __future__ import annotations

import gc
import signal
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Callable

import twisted
from twisted.logger import (
    FilteringLogObserver,
    ILogFilterPredicate,
    ILogObserver,
    Logger,
    PredicateResult,
    globalLogPublisher,
    jsonFileLogObserver,
    textFileLogObserver,
)
from twisted.python import usage
from zope.interface import implementer

from authsrv import events
from authsrv.auditlog import AuditObserver, WithoutAudit
from authsrv.config import MAX_WORKERS, Config, ConfigFileError, ConfigSource, load_config, read_config_file
from authsrv.drain import stop_on_sigterm
from authsrv.embedded import DEFAULT_DATA_DIR, prepare_data_dir
from authsrv.jsonlog import json_log_observer
from authsrv.logfile import STDOUT, LineFile, hold_reopen_signals, reopen_on_signals
from authsrv.scheduling import batch_on_one_core
from authsrv.service import AuthsrvService, StartupError, build, build_supervisor
from authsrv.workers import Supervisor, WorkerError, stop_with_parent, worker_role

log = Logger()


class Options(usage.Options):
    """
    Secrets are deliberately not options: they come from the environment or
    files named in the config, never from a command line others can read.
    """

    synopsis = "[--config FILE] [--listen ENDPOINT] [--public-url URL] [--data-dir DIR] [--workers N]"
    longdesc = (
        "Run the authsrv OAuth 2.1 / OpenID Connect server. Without --config it runs"
        " the embedded default: a data folder (SQLite store, generated keys, a users"
        " file) created on first start, listening on 127.0.0.1:8080."
    )
    optParameters = [
        ["config", "c", None, "The TOML config file."],
        ["listen", "l", None, "A Twisted endpoint string overriding server.listen, e.g. tcp:8080."],
        ["public-url", "u", None,
         "The base URL clients reach the server at, overriding AUTHSRV_PUBLIC_URL and server.public_url;"
         " the issuer is this URL + /api/auth."],
        ["data-dir", "d", DEFAULT_DATA_DIR, "The embedded default's data folder (without --config)."],
        ["workers", "w", None,
         "Processes sharing the listeners, overriding server.workers (default 1); one per core is the most useful."],
    ]

    def opt_version(self):
        """Display authsrv's version, and Twisted's, and exit."""
        print(f"authsrv {version('authsrv')} (Twisted {twisted.__version__})")
        raise SystemExit(0)

    def postOptions(self):
        if self["config"] is not None and self["data-dir"] != DEFAULT_DATA_DIR:
            raise usage.UsageError("--data-dir is for the embedded default; the config file names its own paths")
        if self["workers"] is not None:
            try:
                self["workers"] = int(self["workers"])
            except ValueError:
                raise usage.UsageError(f"--workers must be a whole number, not {self['workers']!r}") from None
            if not 1 <= self["workers"] <= MAX_WORKERS:
                raise usage.UsageError(f"--workers must be between 1 and {MAX_WORKERS}, not {self['workers']}")


def _embedded(data_dir: Path):
    """The embedded default's config file, its data folder made first if need be; one line if it cannot be."""
    try:
        return prepare_data_dir(data_dir)
    except OSError as e:
        raise StartupError(f"--data-dir: cannot use {data_dir} as the data folder: {e.strerror}") from None


def start_audit_log(config: Config) -> AuditObserver:
    """The audit events, from now on, to C{[audit] path} (standard output by default)."""
    path = config.audit_path or STDOUT
    try:
        observer = AuditObserver(LineFile(path))
    except OSError as e:
        raise StartupError(f"audit.path: cannot open {path}: {e.strerror}") from None
    globalLogPublisher.addObserver(observer)
    return observer


def freeze_startup_heap() -> None:
    """
    Put what startup made (modules, plugins, the config, the site) out of
    the cyclic garbage collector's reach: its full collections otherwise
    walk that whole heap while every request in flight waits, the largest
    part of p99 under load (bench/README.md, "Collector pauses").
    """
    gc.collect()
    gc.freeze()


INTERIM_ANSWER = "Ignoring unexpected {code} response"
"""
What Twisted's HTTP client logs, at info, for each 1xx answer it skips:
a peer this server asks (a client's document or key set, a back-channel
logout, the chat platform) could send thousands in the bytes one answer
may take, each a line of the log.
"""


@implementer(ILogFilterPredicate)
class WithoutInterimAnswers:
    """The diagnostic log's filter: no line for each 1xx answer a peer sends (L{INTERIM_ANSWER})."""

    def __call__(self, event) -> PredicateResult:
        return PredicateResult.no if event.get("log_format") == INTERIM_ANSWER else PredicateResult.maybe


def diagnostic_log_factory(chosen, log_format: str | None):
    """
    The observer factory C{twist} starts its log with: C{[log] format} when
    set, else twist's own choice (C{--log-format}, or JSON when the log is
    not a terminal), JSON always as L{authsrv.jsonlog} writes it; the audit
    events are left to the audit log, and Twisted's line for each 1xx
    answer a peer sends is dropped (L{WithoutInterimAnswers}).
    """
    base: Callable[..., ILogObserver]
    if log_format == "json" or (log_format is None and chosen is jsonFileLogObserver):
        base = json_log_observer
    elif log_format == "text" or chosen is None:
        base = textFileLogObserver
    else:
        base = chosen
    return lambda out: FilteringLogObserver(base(out), [WithoutAudit(), WithoutInterimAnswers()])


def say_config_not_reloaded(source: ConfigSource, number: int) -> None:
    """
    SIGHUP reopens the log files and reloads no config: when the config
    file was edited since start, say so, so that an operator who expected a
    reload does not take the config in force for the edited one.
    """
    if number == signal.SIGHUP and source.edited():
        log.warn("{path} changed since start and is not reloaded: SIGHUP only reopens the log files; restart"
                 " authsrv to apply it (authsrv-admin check-config checks it first)", path=str(source.path))


def makeService(options, reactor=None):
    if reactor is None:
        from twisted.internet import reactor
    batch_on_one_core()
    hold_reopen_signals()
    try:
        role = worker_role()
        if role is not None:
            stop_with_parent(role)
        if options["config"] is None:
            config_path, created = _embedded(Path(options["data-dir"]))
        else:
            config_path, created = Path(options["config"]), None
        source = ConfigSource(config_path, read_config_file(config_path) if role is None else role.config)
        config = load_config(config_path, listen=options["listen"], public_url=options["public-url"],
                             source=source.data)
        audit = start_audit_log(config)
        workers = options["workers"] or config.workers
        if role is None:
            events.config_loaded(path=str(config_path.resolve()), issuer=config.issuer, clients=len(config.clients))
        service: AuthsrvService | Supervisor
        if role is None and workers > 1:
            service = build_supervisor(config, reactor, workers, source)
        else:
            service = build(config, reactor, role, audit.file)
    except (ConfigFileError, StartupError, WorkerError) as e:
        raise SystemExit(f"authsrv: {e}") from None
    if created is not None:
        print(created.summary(config.issuer), flush=True)
    twist = getattr(options, "parent", None)
    if twist is not None:
        twist["fileLogObserverFactory"] = diagnostic_log_factory(twist.get("fileLogObserverFactory"), config.log_format)
    reactor.callWhenRunning(stop_on_sigterm, reactor)
    if isinstance(service, Supervisor):
        supervisor = service

        def then(number: int) -> None:
            supervisor.signal_workers(number)
            say_config_not_reloaded(source, number)

        reactor.callWhenRunning(reopen_on_signals, reactor, [audit.file], then)
    else:
        log_files = [audit.file] + ([service.access_log.file] if service.access_log is not None else [])
        reactor.callWhenRunning(reopen_on_signals, reactor, log_files,
                                partial(say_config_not_reloaded, source) if role is None else None)
    reactor.callWhenRunning(freeze_startup_heap)
    return service
