"""
C{twist authsrv}: command-line options and the service maker.
"""

from __future__ import annotations

from pathlib import Path

from twisted.python import usage

from authsrv.config import ConfigFileError, load_config
from authsrv.drain import stop_on_sigterm
from authsrv.embedded import DEFAULT_DATA_DIR, prepare_data_dir
from authsrv.service import StartupError, build


class Options(usage.Options):
    """
    Secrets are deliberately not options: they come from the environment or
    files named in the config, never from a command line others can read.
    """

    synopsis = "[--config FILE] [--listen ENDPOINT] [--public-url URL] [--data-dir DIR]"
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
    ]

    def postOptions(self):
        if self["config"] is not None and self["data-dir"] != DEFAULT_DATA_DIR:
            raise usage.UsageError("--data-dir is for the embedded default; the config file names its own paths")


def makeService(options, reactor=None):
    if reactor is None:
        from twisted.internet import reactor
    try:
        if options["config"] is None:
            config_path, created = prepare_data_dir(Path(options["data-dir"]))
        else:
            config_path, created = Path(options["config"]), None
        config = load_config(config_path, listen=options["listen"], public_url=options["public-url"])
        service = build(config, reactor)
    except (ConfigFileError, StartupError) as e:
        raise SystemExit(f"authsrv: {e}") from None
    if created is not None:
        print(created.summary(config.issuer), flush=True)
    reactor.callWhenRunning(stop_on_sigterm, reactor)
    return service
