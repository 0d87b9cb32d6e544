"""
Listen strings and the TLS files named in C{ssl:} ones: relative paths are
taken from the config file's folder (as every other path in it), and the
certificate and key are checked before Twisted loads them, so that a
mistake is one line naming the key instead of a traceback at start.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_private_key
from twisted.internet.endpoints import serverFromString

from authsrv.proxyheader import CheckedProxyEndpoint

FILE_PARAMETERS = ("privateKey", "certKey", "extraCertChain", "dhParameters")
DEFAULT_PRIVATE_KEY = "server.pem"
"""Twisted's default for C{privateKey}, which also holds the certificate when C{certKey} is absent."""


def _parts(description: str) -> list[list[str]]:
    """
    The unescaped parts of an endpoint string, as Twisted tokenizes it: each
    C{[value]} or C{[key, value]}; a backslash escapes the next character,
    and C{=} in a value is literal.
    """
    parts: list[list[str]] = [[""]]
    characters = iter(description)
    for c in characters:
        if c == "\\":
            parts[-1][-1] += next(characters, "")
        elif c == ":":
            parts.append([""])
        elif c == "=" and len(parts[-1]) == 1:
            parts[-1].append("")
        else:
            parts[-1][-1] += c
    return parts


def _escape(text: str, key: bool) -> str:
    text = text.replace("\\", "\\\\").replace(":", "\\:")
    return text.replace("=", "\\=") if key else text


def _join(parts: list[list[str]]) -> str:
    return ":".join(
        "=".join((_escape(part[0], True), _escape(part[1], False))) if len(part) == 2 else _escape(part[0], True)
        for part in parts
    )


def _kind(parts: list[list[str]]) -> str | None:
    """The endpoint type a listen string's parts begin with, in lower case; None when the first part is keyed."""
    return parts[0][0].strip().lower() if parts and len(parts[0]) == 1 else None


def _is_ssl(parts: list[list[str]]) -> bool:
    return _kind(parts) == "ssl"


def resolve_tls_paths(description: str, base_dir: Path) -> str:
    """
    C{description} with the TLS file paths of an C{ssl:} endpoint made
    absolute against C{base_dir}; any other endpoint string is unchanged.
    """
    parts = _parts(description)
    if not _is_ssl(parts):
        return description
    if not any(len(p) == 2 and p[0] == "privateKey" for p in parts):
        parts.append(["privateKey", DEFAULT_PRIVATE_KEY])
    for part in parts:
        if len(part) == 2 and part[0] in FILE_PARAMETERS:
            part[1] = str(base_dir / Path(part[1]).expanduser())
    return _join(parts)


def hsts_headers(public_url: str, max_age: int) -> tuple[tuple[bytes, bytes], ...]:
    """C{Strict-Transport-Security} for an https public URL, unless C{max_age} is 0."""
    if not public_url.startswith("https:") or max_age <= 0:
        return ()
    return ((b"strict-transport-security", f"max-age={max_age}".encode()),)


def _read(name: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{name} {path}: no such file") from None
    except OSError as e:
        raise ValueError(f"{name} {path}: cannot read it ({e.strerror})") from None


def _certificates(name: str, path: str) -> list[x509.Certificate]:
    try:
        certificates = x509.load_pem_x509_certificates(_read(name, path))
    except ValueError as e:
        if str(e).startswith(name):
            raise
        raise ValueError(f"{name} {path}: not a PEM certificate") from None
    return certificates


def _problem(description: str, now: float | None) -> str | None:
    """What is wrong with the TLS files of a resolved C{ssl:} description, or None."""
    parameters = {p[0]: p[1] for p in _parts(description) if len(p) == 2}
    key_path = parameters["privateKey"]
    cert_name = "certKey" if "certKey" in parameters else "privateKey"
    cert_path = parameters.get("certKey", key_path)
    try:
        try:
            key = load_pem_private_key(_read("privateKey", key_path), password=None)
        except (ValueError, TypeError) as e:
            if str(e).startswith("privateKey"):
                raise
            raise ValueError(f"privateKey {key_path}: not an unencrypted PEM private key") from None
        certificate = _certificates(cert_name, cert_path)[0]
        if "extraCertChain" in parameters:
            _certificates("extraCertChain", parameters["extraCertChain"])
    except ValueError as e:
        return str(e)
    spki = (Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    if certificate.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        return f"privateKey {key_path}: does not match the certificate in {cert_path}"
    if now is not None:
        moment = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
        if certificate.not_valid_after_utc < moment:
            return f"{cert_name} {cert_path}: the certificate expired on {certificate.not_valid_after_utc:%Y-%m-%d}"
        if certificate.not_valid_before_utc > moment:
            return f"{cert_name} {cert_path}: the certificate is not valid before {certificate.not_valid_before_utc:%Y-%m-%d}"
    return None


def listen_problem(key: str, description: str, base_dir: Path, now: float | None = None) -> str | None:
    """
    One line naming C{key} (such as C{server.listen[0]}) and what is wrong
    with the TLS files of C{description}, or None; certificate dates are
    checked only when C{now} is given.
    """
    if not _is_ssl(_parts(description)):
        return None
    problem = _problem(resolve_tls_paths(description, base_dir), now)
    return f"{key}: {problem}" if problem else None


def endpoint_of(reactor, key: str, description: str, base_dir: Path, now: float | None = None):
    """
    The server endpoint C{description} names, parsed as the server parses
    it, without listening; L{ValueError} with one line naming C{key} when
    its TLS files are wrong (L{listen_problem}, dates checked with C{now})
    or Twisted cannot parse it. A C{haproxy:} listener checks each
    connection's PROXY header (L{CheckedProxyEndpoint}).
    """
    problem = listen_problem(key, description, base_dir, now) or _port_problem(key, description)
    if problem:
        raise ValueError(problem)
    resolved = resolve_tls_paths(description, base_dir)
    try:
        if _kind(_parts(description)) == "haproxy":
            return CheckedProxyEndpoint(serverFromString(reactor, resolved.partition(":")[2]), reactor)
        return serverFromString(reactor, resolved)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{key}: {description!r} is not a valid endpoint ({e})") from None


_PORTED = {"tcp", "tcp6", "ssl"}
"""The endpoint types whose first argument is a port."""


def _port_problem(key: str, description: str) -> str | None:
    """
    One line naming C{key} when C{description}'s port is not 0 to 65535:
    Twisted parses any integer and only the bind refuses it, so a check
    that stops at parsing would pass C{tcp:99999}.
    """
    parts = _parts(description)
    if _kind(parts) == "haproxy":
        parts = parts[1:]
    if _kind(parts) not in _PORTED:
        return None
    keyed = {part[0]: part[1] for part in parts[1:] if len(part) == 2}
    positional = [part[0] for part in parts[1:] if len(part) == 1]
    try:
        port = int(keyed.get("port", positional[0] if positional else ""))
    except ValueError:
        return None
    if 0 <= port <= 65535:
        return None
    return f"{key}: {description!r} names port {port}; a port is 0 to 65535"


def config_listeners(config) -> list[tuple[str, tuple[str, ...]]]:
    """Every listen setting of the config, with its key, whether or not the server binds it."""
    return [("server.listen", config.listen), ("internal.listen", config.internal_listen),
            ("admin.listen", config.admin.listen), ("metrics.listen", config.metrics_listen)]


def config_listen_problems(config, reactor, now: float) -> list[str]:
    """
    What is wrong with each listen string of the config, one line each
    naming its key: its TLS files, else its syntax.
    """
    problems = []
    for name, descriptions in config_listeners(config):
        for index, description in enumerate(descriptions):
            try:
                endpoint_of(reactor, f"{name}[{index}]", description, config.base_dir, now)
            except ValueError as e:
                problems.append(str(e))
    return problems
