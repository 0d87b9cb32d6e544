"""
One public URL: C{--public-url} wins over C{AUTHSRV_PUBLIC_URL}, which wins
over the file's C{[server] public_url}; with none of them (or the file's
loopback default) the issuer follows the first listener's port. The demo
on a free port, told its URL on the command line, signs a user in through
the example app, which finds the issuer by discovery.
"""

from __future__ import annotations

import shutil

import pytest

from authsrv.config import ConfigFileError, derived_public_url, load_config

from conftest import EXAMPLES, free_port
from test_example_app import Stack


def config_file(tmp_path, server: str = ""):
    (tmp_path / "users.toml").write_text("")
    path = tmp_path / "authsrv.toml"
    path.write_text(f"[server]\n{server}\n")
    return path


@pytest.mark.parametrize(
    "server, listen, flag, env, expected",
    [
        ("", None, None, None, "http://127.0.0.1:8080"),
        ("", "tcp:9090", None, None, "http://127.0.0.1:9090"),
        ('listen = ["tcp:7070:interface=127.0.0.1"]', None, None, None, "http://127.0.0.1:7070"),
        ('public_url = "http://127.0.0.1:8080"', "tcp:9090", None, None, "http://127.0.0.1:9090"),
        ('public_url = "https://id.example.com"', "tcp:9090", None, None, "https://id.example.com"),
        ('public_url = "http://localhost:8080"', "tcp:9090", None, None, "http://localhost:8080"),
        ('public_url = "https://id.example.com"', None, None, "https://env.example.com/", "https://env.example.com"),
        ('public_url = "https://id.example.com"', None, "https://flag.example.com", "https://env.example.com",
         "https://flag.example.com"),
        ("", "tcp:9090", "http://127.0.0.1:9191", None, "http://127.0.0.1:9191"),
    ],
)
def test_precedence(tmp_path, server, listen, flag, env, expected):
    environ = {"AUTHSRV_PUBLIC_URL": env} if env else {}
    config = load_config(config_file(tmp_path, server), listen=listen, public_url=flag, environ=environ)
    assert config.public_url == expected
    assert config.issuer == expected + "/api/auth"
    if listen is not None:
        assert config.listen == (listen,)


@pytest.mark.parametrize(
    "listen, expected",
    [
        ("tcp:port=9091:interface=127.0.0.1", "http://127.0.0.1:9091"),
        (r"tcp6:9000:interface=\:\:1", "http://[::1]:9000"),
        ("tcp:9000:interface=0.0.0.0", "http://127.0.0.1:9000"),
        ("ssl:8443:privateKey=key.pem:certKey=cert.pem", "https://127.0.0.1:8443"),
        ("haproxy:tcp:7000", "http://127.0.0.1:7000"),
        ("unix:/run/authsrv.sock", "http://127.0.0.1:8080"),
        ("tcp:99999:interface=127.0.0.1", "http://127.0.0.1:8080"),
    ],
)
def test_derived_from_the_first_listener(listen, expected):
    assert derived_public_url((listen, "tcp:1")) == expected


@pytest.mark.parametrize(
    "flag, env, expected",
    [
        ("http://id.example.com", None, "--public-url: must use https"),
        (None, "ftp://id.example.com", "AUTHSRV_PUBLIC_URL: 'ftp://id.example.com' must be an absolute http(s) URL"),
        ("https://id.example.com/?x=1", None, "--public-url: must not have a query"),
    ],
)
def test_bad_override_names_its_source(tmp_path, flag, env, expected):
    environ = {"AUTHSRV_PUBLIC_URL": env} if env else {}
    with pytest.raises(ConfigFileError) as raised:
        load_config(config_file(tmp_path), public_url=flag, environ=environ)
    assert expected in str(raised.value)


def test_a_bad_file_value_is_an_error_even_when_overridden(tmp_path):
    path = config_file(tmp_path, 'public_url = "http://id.example.com"')
    with pytest.raises(ConfigFileError) as raised:
        load_config(path, public_url="https://id.example.com", environ={})
    assert "server.public_url: must use https" in str(raised.value)


@pytest.mark.slow
def test_demo_on_a_free_port_follows_listen_and_environment(run_server, tmp_path):
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("demo-data"))
    config = str(tmp_path / "examples" / "demo.toml")
    port = free_port()
    listen = f"tcp:{port}:interface=127.0.0.1"
    derived = run_server(["authsrv", "--config", config, "--listen", listen], tmp_path, port=port)
    discovery = derived.get_json("/api/auth/.well-known/openid-configuration")
    assert discovery["issuer"] == f"http://127.0.0.1:{port}/api/auth"
    assert discovery["token_endpoint"] == f"http://127.0.0.1:{port}/api/auth/oauth2/token"
    derived.stop()

    other = free_port()
    from_env = run_server(["authsrv", "--config", config, "--listen", listen], tmp_path, port=port,
                          env={"AUTHSRV_PUBLIC_URL": f"http://localhost:{other}"})
    assert from_env.get_json("/api/auth/jwks")["keys"]
    issuer = from_env.get_json("/api/auth/.well-known/openid-configuration")["issuer"]
    assert issuer == f"http://localhost:{other}/api/auth"
    from_env.stop()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_sign_in_through_the_demo_started_with_public_url(run_server, tmp_path):
    stack = Stack(tmp_path, run_server, limits="", app_args=[])
    try:
        issuer = stack.authsrv.get_json("/api/auth/.well-known/openid-configuration")["issuer"]
        assert issuer == stack.issuer == f"http://127.0.0.1:{stack.authsrv.port}/api/auth"
        page = stack.sign_in("alice", "alice-password")
        assert "Hello, Alice Liddell" in page.text
    finally:
        log = stack.stop()
    assert f"discovered {stack.issuer}" in log
