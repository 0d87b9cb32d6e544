"""
Transport under an https public URL: HSTS on every response, __Host-
cookies, TLS files in ssl: listen strings taken from the config file's
folder, and check-config reporting what is wrong with them.
"""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import socket
import ssl
import time

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet.task import Clock
from twisted.web import http as web_http
from twisted.web.resource import Resource
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel

from authsrv.config import InputLimits, load_config
from authsrv.identity.static import create_users_file
from authsrv.tls import config_listen_problems, resolve_listen_paths, shared_port_problems
from authsrv.web.cookies import SESSION_COOKIE, Cookies
from authsrv.web.limits import LimitedSite

from conftest import admin, free_port
from wire import Listener, parse, request_head

DAY = datetime.timedelta(days=1)


def write_pair(folder, *, valid_from=None, valid_days=30, name="server"):
    """A fresh key and a self-signed certificate for 127.0.0.1 in C{folder}: (key, cert) paths."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    start = valid_from or datetime.datetime.now(datetime.timezone.utc) - DAY
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + valid_days * DAY)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    key_path, cert_path = folder / f"{name}.key", folder / f"{name}.crt"
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


FFDHE2048 = """\
-----BEGIN DH PARAMETERS-----
MIIBCAKCAQEA//////////+t+FRYortKmq/cViAnPTzx2LnFg84tNpWp4TZBFGQz
+8yTnc4kmz75fS/jY2MMddj2gbICrsRhetPfHtXV/WVhJDP1H18GbtCFY2VVPe0a
87VXE15/V8k1mE8McODmi3fipona8+/och3xWKE2rec1MKzKT0g6eXq8CrGCsyT7
YdEIqUuyyOP7uWrat2DX9GgdT0Kj3jlN9K5W7edjcrsZCwenyO4KbXCeAvzhzffi
7MA0BM0oNC9hkXL+nOmFg/+OTxIy7vKBg8P+OxtMb61zO7X8vC7CIAXFjvGDfRaD
ssbzSibBsu/6iGtCOGEoXJf//////////wIBAg==
-----END DH PARAMETERS-----
"""
"""The RFC 7919 group ffdhe2048, which OpenSSL takes for C{dhParameters}."""


def config_file(folder, listen: str, public_url: str = "https://127.0.0.1:8443", extra: str = ""):
    path = folder / "authsrv.toml"
    create_users_file(folder / "users.toml")
    path.write_text(
        f'[server]\npublic_url = "{public_url}"\nlisten = [{listen!r}]\n{extra}\n'
        '[internal]\nserve_on_main = true\n'
    )
    return path


def test_relative_listen_paths_resolve_against_the_config_folder(tmp_path):
    assert resolve_listen_paths("ssl:8443:privateKey=tls/k.pem:certKey=tls/c.pem", tmp_path) == (
        f"ssl:8443:privateKey={tmp_path}/tls/k.pem:certKey={tmp_path}/tls/c.pem"
    )
    assert resolve_listen_paths("ssl:8443:privateKey=/etc/k.pem", tmp_path) == "ssl:8443:privateKey=/etc/k.pem"
    assert resolve_listen_paths("ssl:8443", tmp_path) == f"ssl:8443:privateKey={tmp_path}/server.pem"
    assert resolve_listen_paths("ssl:8443:privateKey=a\\:b.pem:extraCertChain=chain.pem", tmp_path) == (
        f"ssl:8443:privateKey={tmp_path}/a\\:b.pem:extraCertChain={tmp_path}/chain.pem"
    )
    assert resolve_listen_paths("haproxy:ssl:8443:privateKey=k.pem", tmp_path) == (
        f"haproxy:ssl:8443:privateKey={tmp_path}/k.pem"
    )
    assert resolve_listen_paths("tcp:8080:interface=127.0.0.1", tmp_path) == "tcp:8080:interface=127.0.0.1"
    assert resolve_listen_paths("unix:run/authsrv.sock:mode=600", tmp_path) == f"unix:{tmp_path}/run/authsrv.sock:mode=600"
    assert resolve_listen_paths("haproxy:unix:address=a.sock", tmp_path) == f"haproxy:unix:address={tmp_path}/a.sock"
    assert resolve_listen_paths("unix:/run/authsrv.sock", tmp_path) == "unix:/run/authsrv.sock"
    assert resolve_listen_paths("unix:\0authsrv", tmp_path) == "unix:\0authsrv"


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing key", "server.listen[0]: privateKey {folder}/tls/nothing.key: no such file"),
        ("behind haproxy", "server.listen[0]: privateKey {folder}/tls/nothing.key: no such file"),
        ("key not PEM", "server.listen[0]: privateKey {folder}/tls/server.crt: not an unencrypted PEM private key"),
        ("cert not PEM", "server.listen[0]: certKey {folder}/tls/server.key: not a PEM certificate"),
        ("mismatch", "server.listen[0]: privateKey {folder}/tls/other.key: does not match the certificate in"
                     " {folder}/tls/server.crt"),
        ("expired", "server.listen[0]: certKey {folder}/tls/old.crt: the certificate expired on 2020-01-31"),
        ("bad chain", "server.listen[0]: extraCertChain {folder}/tls/server.key: not a PEM certificate"),
        ("dh not PEM", "server.listen[0]: dhParameters {folder}/tls/server.crt: not Diffie-Hellman parameters"
                       " OpenSSL accepts (no start line)"),
        ("missing dh", "server.listen[0]: dhParameters {folder}/tls/nothing.pem: no such file"),
        ("unknown method", "server.listen[0]: 'ssl:8443:privateKey=tls/server.key:certKey=tls/server.crt"
                           ":sslmethod=SSLv2_METHOD' is not a valid endpoint (module 'OpenSSL.SSL' has no attribute"
                           " 'SSLv2_METHOD')"),
        ("fine", None),
        ("fine with dh", None),
    ],
)
def test_check_config_names_what_is_wrong_with_the_tls_files(tmp_path, case, expected):
    write_pair(tmp_path / "tls")
    write_pair(tmp_path / "tls", name="other")
    write_pair(tmp_path / "tls", name="old", valid_from=datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc))
    listen = {
        "missing key": "ssl:8443:privateKey=tls/nothing.key:certKey=tls/server.crt",
        "behind haproxy": "haproxy:ssl:8443:privateKey=tls/nothing.key:certKey=tls/server.crt",
        "key not PEM": "ssl:8443:privateKey=tls/server.crt:certKey=tls/server.crt",
        "cert not PEM": "ssl:8443:privateKey=tls/server.key:certKey=tls/server.key",
        "mismatch": "ssl:8443:privateKey=tls/other.key:certKey=tls/server.crt",
        "expired": "ssl:8443:privateKey=tls/old.key:certKey=tls/old.crt",
        "bad chain": "ssl:8443:privateKey=tls/server.key:certKey=tls/server.crt:extraCertChain=tls/server.key",
        "dh not PEM": "ssl:8443:privateKey=tls/server.key:certKey=tls/server.crt:dhParameters=tls/server.crt",
        "missing dh": "ssl:8443:privateKey=tls/server.key:certKey=tls/server.crt:dhParameters=tls/nothing.pem",
        "unknown method": "ssl:8443:privateKey=tls/server.key:certKey=tls/server.crt:sslmethod=SSLv2_METHOD",
        "fine": "ssl:8443:privateKey=tls/server.key:certKey=tls/server.crt",
        "fine with dh": "ssl:8443:privateKey=tls/server.key:certKey=tls/server.crt:dhParameters=tls/dh.pem",
    }[case]
    (tmp_path / "tls" / "dh.pem").write_text(FFDHE2048)
    config = load_config(config_file(tmp_path, listen))
    problems = config_listen_problems(config, Clock(), time.time())
    assert problems == ([expected.format(folder=tmp_path)] if expected else [])


@pytest.mark.parametrize(
    ("metrics", "taken"),
    [
        ("tcp:8080:interface=127.0.0.1", "port 8080, as server.listen[0]"),
        ("tcp:8080", "port 8080, as server.listen[0]"),
        ("tcp:8080:127.0.0.1", "port 8080, as server.listen[0]"),
        ("haproxy:tcp:port=8080:interface=127.0.0.1", "port 8080, as server.listen[0]"),
        ("ssl:8080:privateKey=k.pem:certKey=c.pem", "port 8080, as server.listen[0]"),
        ("tcp6:9090", "port 9090, as server.listen[1]"),
        ("tcp:8080:interface=127.0.0.2", None),
        ("tcp:9090", None),
        (r"tcp6:8080:interface=\:\:1", None),
        ("tcp:0:interface=127.0.0.1", None),
        ("unix:/run/metrics.sock", None),
    ],
)
def test_two_listeners_on_one_port_are_one_line_naming_both(metrics, taken):
    """
    The same port of one family on the same interface, or on every
    interface of either; port 0 always gets a free one.
    """
    groups = [("server.listen", ("tcp:8080:interface=127.0.0.1", r"tcp6:9090:interface=\:\:1", "tcp:0")),
              ("metrics.listen", (metrics,))]
    assert shared_port_problems(groups) == (
        [f"metrics.listen[0]: {metrics!r} binds {taken} does; give each listener a port of its own"] if taken else []
    )


@pytest.mark.parametrize(
    ("listen", "port"),
    [("tcp:99999:interface=127.0.0.1", 99999), ("tcp:-1", -1), ("tcp6:port=65536", 65536),
     ("haproxy:tcp:70000", 70000), ("tcp:65535", None), ("tcp:0:interface=127.0.0.1", None)],
)
def test_check_config_refuses_a_port_out_of_range(tmp_path, listen, port):
    """Twisted parses any integer as a port; only the bind would refuse it, after the check had passed."""
    config = load_config(config_file(tmp_path, listen))
    problems = config_listen_problems(config, Clock(), time.time())
    assert problems == ([f"server.listen[0]: {listen!r} names port {port}; a port is 0 to 65535"] if port else [])


@pytest.mark.parametrize(
    ("listen", "refused"),
    [("unix:", True), ("haproxy:unix:", True), ("unix:mode=600", True), ("unix:address=", True),
     ("unix:authsrv.sock", False), ("unix:address=run/a.sock:mode=600", False), ("unix:\0authsrv", False)],
)
def test_check_config_refuses_a_unix_socket_without_a_path(tmp_path, listen, refused):
    """
    An empty socket path was made the config file's folder, which check-config
    passed and the bind refused as an address in use.
    """
    assert resolve_listen_paths("unix:", tmp_path) == "unix:"
    config = load_config(config_file(tmp_path, listen))
    problems = config_listen_problems(config, Clock(), time.time())
    assert problems == ([f"server.listen[0]: {listen!r} names no socket path; write unix:PATH (relative to the"
                         " config file's folder)"] if refused else [])


@pytest_twisted.ensureDeferred
async def test_check_config_exits_1_with_one_line_for_an_expired_certificate(tmp_path):
    write_pair(tmp_path / "tls", valid_from=datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc))
    path = config_file(tmp_path, "ssl:8443:privateKey=tls/server.key:certKey=tls/server.crt")
    result = await admin("check-config", str(path), cwd=tmp_path.parent)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"authsrv-admin: {path}: server.listen[0]: certKey {tmp_path}/tls/server.crt:"
        " the certificate expired on 2020-01-31"
    ]


@pytest.mark.parametrize("path", ["/healthz", "/api/auth/jwks", "/nowhere", "/api/auth/oauth2/authorize"])
def test_hsts_on_every_response_under_https(path):
    listener = Listener(server={"public_url": "https://auth.example.com"})
    _, transport = listener.send(request_head("GET", path))
    assert parse(transport)[1]["strict-transport-security"] == "max-age=31536000"


def test_hsts_on_refusals_below_the_request_layer_too():
    listener = Listener({"max_header_count": 10}, server={"public_url": "https://auth.example.com", "hsts_max_age": "1d"})
    _, transport = listener.send(request_head("GET", "/healthz", {f"X-{n}": "1" for n in range(11)}))
    status, headers, _ = parse(transport)
    assert (status, headers["strict-transport-security"]) == (431, "max-age=86400")


@pytest.mark.parametrize("server", [{"public_url": "https://auth.example.com", "hsts_max_age": 0}, {}])
def test_no_hsts_when_turned_off_or_under_plain_http(server):
    listener = Listener(server=server)
    _, transport = listener.send(request_head("GET", "/healthz"))
    assert "strict-transport-security" not in parse(transport)[1]


def cookie_header(secure: bool) -> tuple[str, Cookies]:
    cookies = Cookies(path="/api/auth", secure=secure)
    request = Request(DummyChannel())
    cookies.set(request, SESSION_COOKIE, "value", 60)
    return request.cookies[0].decode(), cookies


def test_tls_offers_http_1_1_alone_even_where_h2_is_installed(monkeypatch):
    """
    twisted.web's Site offers h2 by ALPN when the h2 package is installed,
    which the site's channel (HTTP/1.1 only) cannot speak: every browser
    would negotiate h2 and send a preface the channel refuses.
    """
    monkeypatch.setattr(web_http, "H2_ENABLED", True)
    assert LimitedSite(Resource(), limits=InputLimits()).acceptableProtocols() == [b"http/1.1"]


def test_cookies_under_https_carry_the_host_prefix():
    header, cookies = cookie_header(True)
    flags = [part.strip() for part in header.split(";")]
    assert flags[0] == "__Host-authsrv_session=value"
    assert {"Secure", "Path=/", "HttpOnly", "SameSite=lax"} <= set(flags)
    assert not [f for f in flags if f.lower().startswith("domain")]
    request = Request(DummyChannel())
    request.received_cookies = {b"authsrv_session": b"planted", b"__Host-authsrv_session": b"real"}
    assert cookies.get(request, SESSION_COOKIE) == "real"


def test_cookies_under_plain_http_keep_their_names_and_path():
    header, cookies = cookie_header(False)
    flags = [part.strip() for part in header.split(";")]
    assert flags[0] == "authsrv_session=value" and "Path=/api/auth" in flags and "Secure" not in flags
    request = Request(DummyChannel())
    request.received_cookies = {b"authsrv_session": b"plain"}
    assert cookies.get(request, SESSION_COOKIE) == "plain"


def answered(server, attempt, problem: str):
    """What C{attempt()} gives once it gives anything, tried again for up to 30 s while the server runs."""
    deadline = time.monotonic() + 30
    while True:
        assert server.process.poll() is None, server.output()
        try:
            answer = attempt()
            if answer is not None:
                return answer
        except OSError:
            pass
        assert time.monotonic() < deadline, problem
        time.sleep(0.2)


@pytest.mark.slow
def test_a_real_server_over_tls_with_relative_paths(run_server, tmp_path):
    folder = tmp_path / "conf"
    write_pair(folder / "tls")
    port = free_port()
    listen = f"ssl:{port}:interface=127.0.0.1:privateKey=tls/server.key:certKey=tls/server.crt"
    path = config_file(folder, listen, public_url=f"https://127.0.0.1:{port}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    server = run_server(["authsrv", "--config", str(path)], elsewhere, port=port, ready=False)
    context = ssl.create_default_context(cafile=str(folder / "tls" / "server.crt"))

    def ready():
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
        connection.request("GET", "/readyz")
        response = connection.getresponse()
        response.read()
        return (connection, response) if response.status == 200 else None

    connection, response = answered(server, ready, "not ready over TLS")
    assert response.getheader("strict-transport-security") == "max-age=31536000"
    connection.request("GET", "/api/auth/.well-known/openid-configuration")
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("strict-transport-security") == "max-age=31536000"
    response.read()
    server.stop()


@pytest.mark.slow
def test_behind_haproxy_the_proxy_header_comes_before_tls(run_server, tmp_path):
    """
    A proxy sends the PROXY header in the clear, then the client's TLS
    handshake: Twisted's haproxy:ssl: looked for the header inside TLS, so
    every handshake failed and nothing was logged.
    """
    folder = tmp_path / "conf"
    write_pair(folder / "tls")
    port = free_port()
    listen = f"haproxy:ssl:{port}:interface=127.0.0.1:privateKey=tls/server.key:certKey=tls/server.crt"
    path = config_file(folder, listen, public_url=f"https://127.0.0.1:{port}", extra='access_log = "json"')
    server = run_server(["authsrv", "--config", str(path)], tmp_path, port=port, ready=False)
    context = ssl.create_default_context(cafile=str(folder / "tls" / "server.crt"))

    def ready():
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(f"PROXY TCP4 203.0.113.7 127.0.0.1 40000 {port}\r\n".encode())
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                answer = tls.recv(100)
        return answer if answer.startswith(b"HTTP/1.1 200 ") else None

    answered(server, ready, "not ready over TLS behind the PROXY header")
    out, err = server.stop()
    assert '"address":"203.0.113.7"' in out.replace(" ", "") and "Traceback" not in out + err, out + err


@pytest.mark.slow
def test_an_expired_certificate_is_served_with_one_line_at_start(run_server, tmp_path):
    """A restart must not take TLS away, but nothing said why every client refused the server."""
    write_pair(tmp_path / "tls", valid_from=datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc))
    port = free_port()
    listen = f"ssl:{port}:interface=127.0.0.1:privateKey=tls/server.key:certKey=tls/server.crt"
    path = config_file(tmp_path, listen, public_url=f"https://127.0.0.1:{port}")
    server = run_server(["authsrv", "--config", str(path)], tmp_path, port=port, ready=False)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    deadline = time.monotonic() + 30
    while True:
        assert server.process.poll() is None, server.output()
        try:
            connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
            connection.request("GET", "/readyz")
            if connection.getresponse().status == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "not ready over TLS"
        time.sleep(0.2)
    connection.close()
    out, err = server.stop()
    warning = f"server.listen[0]: certKey {tmp_path}/tls/server.crt: the certificate expired on 2020-01-31"
    assert len([line for line in (out + err).splitlines() if warning in line]) == 1, out + err
    assert "Traceback" not in out + err


@pytest.mark.slow
def test_a_bad_tls_file_stops_the_start_with_one_line(run_server, tmp_path):
    port = free_port()
    path = config_file(tmp_path, f"ssl:{port}:interface=127.0.0.1:privateKey=missing.key")
    server = run_server(["authsrv", "--config", str(path)], tmp_path, port=port, ready=False)
    out, err = server.output(timeout=60)
    assert server.process.returncode != 0
    assert f"authsrv: server.listen[0]: privateKey {tmp_path}/missing.key: no such file" in out + err
    assert "Traceback" not in out + err
