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
from OpenSSL import SSL
from twisted.internet.endpoints import serverFromString

from authsrv.proxyheader import CheckedProxyEndpoint, ProxyBeforeTLS

FILE_PARAMETERS = ("privateKey", "certKey", "extraCertChain", "dhParameters")
DEFAULT_PRIVATE_KEY = "server.pem"
"""Twisted's default for C{privateKey}, which also holds the certificate when C{certKey} is absent."""
MAX_PORT = 65535


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


def _unwrapped(parts: list[list[str]]) -> list[list[str]]:
    """The parts of the endpoint a C{haproxy:} prefix wraps, or C{parts} when there is none."""
    return parts[1:] if _kind(parts) == "haproxy" else parts


def _is_ssl(parts: list[list[str]]) -> bool:
    """Whether the endpoint is C{ssl:}, behind C{haproxy:} or not."""
    return _kind(_unwrapped(parts)) == "ssl"


def _socket_address(parts: list[list[str]]) -> list[str] | None:
    """The part of a C{unix:} endpoint's parts (behind C{haproxy:} too) that holds its socket's path, if any."""
    return next((p for p in _unwrapped(parts)[1:] if len(p) == 1 or p[0] == "address"), None)


def _socket_problem(key: str, description: str) -> str | None:
    """
    One line naming C{key} when C{description} is a C{unix:} endpoint that
    names no socket path: an empty one was taken as the config file's
    folder, whose bind said only that the address was in use.
    """
    parts = _parts(description)
    if _kind(_unwrapped(parts)) != "unix":
        return None
    address = _socket_address(parts)
    if address is not None and address[-1]:
        return None
    return f"{key}: {description!r} names no socket path; write unix:PATH (relative to the config file's folder)"


def resolve_listen_paths(description: str, base_dir: Path) -> str:
    """
    C{description} with its paths made absolute against C{base_dir}: the
    TLS files of an C{ssl:} endpoint, the socket of a C{unix:} one (behind
    C{haproxy:} too; not one in the abstract namespace); any other endpoint
    string is unchanged.
    """
    parts = _parts(description)
    if _kind(_unwrapped(parts)) == "unix":
        address = _socket_address(parts)
        if address is not None and address[-1] and not address[-1].startswith("\0"):
            address[-1] = str(base_dir / Path(address[-1]).expanduser())
        return _join(parts)
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


def _check_dh_parameters(path: str) -> None:
    """
    Load the file as OpenSSL does at each TLS connection: a file it refuses
    (not DH parameters, too few bits for its security level) would fail
    every handshake with a traceback, while the start went through.
    """
    _read("dhParameters", path)
    try:
        SSL.Context(SSL.TLS_METHOD).load_tmp_dh(path)
    except SSL.Error as e:
        reasons = [error[2] for error in (e.args[0] if e.args else ()) if error[2]]
        raise ValueError(
            f"dhParameters {path}: not Diffie-Hellman parameters OpenSSL accepts ({reasons[0] if reasons else e})"
        ) from None


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
        if "dhParameters" in parameters:
            _check_dh_parameters(parameters["dhParameters"])
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
    problem = _problem(resolve_listen_paths(description, base_dir), now)
    return f"{key}: {problem}" if problem else None


def endpoint_of(reactor, key: str, description: str, base_dir: Path, now: float | None = None):
    """
    The server endpoint C{description} names, parsed as the server parses
    it, without listening; L{ValueError} with one line naming C{key} when
    its TLS files are wrong (L{listen_problem}, dates checked with C{now})
    or Twisted cannot parse it. A C{haproxy:} listener checks each
    connection's PROXY header (L{CheckedProxyEndpoint}), which comes before
    TLS on a C{haproxy:ssl:} one (L{ProxyBeforeTLS}).
    """
    problem = (listen_problem(key, description, base_dir, now) or _port_problem(key, description)
               or _socket_problem(key, description))
    if problem:
        raise ValueError(problem)
    resolved = resolve_listen_paths(description, base_dir)
    try:
        if _kind(_parts(description)) == "haproxy":
            wrapped = resolved.partition(":")[2]
            if _is_ssl(_parts(wrapped)):
                return serverFromString(ProxyBeforeTLS(reactor), wrapped)
            return CheckedProxyEndpoint(serverFromString(reactor, wrapped), reactor)
        return serverFromString(reactor, resolved)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        # AttributeError: an C{sslmethod} that OpenSSL does not have.
        raise ValueError(f"{key}: {description!r} is not a valid endpoint ({e})") from None


_PORTED = {"tcp": 1, "tcp6": 2, "ssl": 4}
"""The endpoint types whose first argument is a port, with the place of their interface among the arguments."""


def _address(description: str) -> tuple[str, str, int] | None:
    """
    The family (C{tcp6} or C{tcp}), interface and port a C{tcp}, C{tcp6}
    or C{ssl} listen string binds, behind C{haproxy:} too; None for any
    other, or a port that is not an integer.
    """
    parts = _unwrapped(_parts(description))
    kind = _kind(parts)
    if kind not in _PORTED:
        return None
    keyed = {part[0]: part[1] for part in parts[1:] if len(part) == 2}
    positional = [part[0] for part in parts[1:] if len(part) == 1]
    try:
        port = int(keyed.get("port", positional[0] if positional else ""))
    except ValueError:
        return None
    at = _PORTED[kind]
    interface = keyed.get("interface", positional[at] if len(positional) > at else "")
    return "tcp6" if kind == "tcp6" else "tcp", interface, port


def _port_problem(key: str, description: str) -> str | None:
    """
    One line naming C{key} when C{description}'s port is not 0 to 65535:
    Twisted parses any integer and only the bind refuses it, so a check
    that stops at parsing would pass C{tcp:99999}.
    """
    address = _address(description)
    if address is None or 0 <= address[2] <= MAX_PORT:
        return None
    return f"{key}: {description!r} names port {address[2]}; a port is 0 to {MAX_PORT}"


_ANY = {"", "0.0.0.0", "::"}
"""The interfaces that stand for every address of their family, and so take the port on all of them."""


def shared_port_problems(groups: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """
    One line for each listener of C{groups} (each a key and its listen
    strings) that would bind a port an earlier one binds: the same
    interface, or every interface on either side. The bind would only say
    the address is in use, as if another program held it.
    """
    problems = []
    bound: list[tuple[tuple[str, str, int], str]] = []
    for name, descriptions in groups:
        for index, description in enumerate(descriptions):
            address = _address(description)
            if address is None or address[2] == 0:
                continue
            family, interface, port = address
            taken = next((key for (f, i, p), key in bound
                          if (f, p) == (family, port) and (i == interface or {i, interface} & _ANY)), None)
            if taken is not None:
                problems.append(f"{name}[{index}]: {description!r} binds port {port}, as {taken} does;"
                                " give each listener a port of its own")
            bound.append((address, f"{name}[{index}]"))
    return problems


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
