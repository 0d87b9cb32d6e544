"""
C{twist authsrv} as an operator runs it: the embedded default, the demo
config, one-line start-up errors, JSON logs, and durability across kill -9.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import stat
from importlib.metadata import version

import pytest
import pytest_twisted
import twisted
from jwcrypto import jwk, jwt

from authsrv.config import load_config
from authsrv.context import PluginContext
from authsrv.service import build_plugin
from authsrv.tap import Options

from conftest import EXAMPLES, admin, fetch, free_port

pytestmark = pytest.mark.slow


def sign_with_keystore(config_path, reactor, claims):
    """Sign a token with the keystore the server uses, as the server would."""
    config = load_config(config_path)
    context = PluginContext(reactor, config.base_dir, config.limits.max_token_lifetime)
    try:
        return build_plugin("keystore", config.keystore, context).sign(claims)
    finally:
        context.stop()


@pytest_twisted.ensureDeferred
async def test_embedded_default_first_start_restart_and_kill(run_server, tmp_path):
    port = free_port()
    server = run_server(["authsrv", "--listen", f"tcp:{port}:interface=127.0.0.1"], tmp_path, port=port)
    data = tmp_path / "authsrv-data"
    for name in ("authsrv.toml", "authsrv.sqlite3", "keys.jwks.json", "users.toml", "internal-api-secret"):
        assert (data / name).exists(), name
    assert stat.S_IMODE(os.stat(data / "keys.jwks.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(data / "internal-api-secret").st_mode) == 0o600
    config = load_config(data / "authsrv.toml")
    assert config.listen == ("tcp:8080:interface=127.0.0.1",)

    discovery = server.get_json("/api/auth/.well-known/openid-configuration")
    assert discovery["issuer"] == f"http://127.0.0.1:{port}/api/auth", "the issuer did not follow --listen"
    jwks_before = server.get_json("/api/auth/jwks")
    assert jwks_before["keys"]

    added = await admin("--config", str(data / "authsrv.toml"), "client", "add", "my-app",
                  "--redirect-uri", "http://127.0.0.1:9000/callback", cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    out, _ = server.kill()
    assert "first start: created the data folder" in out
    assert "authsrv-admin --config" in out and "user add" in out and "client add" in out
    command = next(line for line in out.splitlines() if "user add alice" in line).split()[0]
    assert (tmp_path / command).exists() or shutil.which(command), f"{command} cannot be run from there"

    again = run_server(["authsrv", "--listen", f"tcp:{port}:interface=127.0.0.1"], tmp_path, port=port)
    assert again.get_json("/api/auth/jwks") == jwks_before
    listed = await admin("--config", str(data / "authsrv.toml"), "client", "list", cwd=tmp_path)
    assert listed.stdout.startswith("my-app\tconfidential"), listed.stdout
    out, _ = again.stop()
    assert "first start" not in out


def test_jwks_verifies_a_token_the_keystore_signed(run_server, tmp_path):
    from twisted.internet import reactor

    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("demo-data"))
    config_path = tmp_path / "examples" / "demo.toml"
    port = free_port()
    server = run_server(["authsrv", "--config", str(config_path), "--listen", f"tcp:{port}:interface=127.0.0.1"],
                        tmp_path, port=port)
    status, headers, body = fetch(server.base + "/api/auth/jwks")
    assert status == 200
    keyset = jwk.JWKSet.from_json(body)
    assert {k.get("alg") for k in json.loads(body)["keys"]} == {"RS256", "ES256", "EdDSA"}
    for key in json.loads(body)["keys"]:
        assert not {"d", "p", "q", "dp", "dq", "qi"} & set(key)
    token = sign_with_keystore(config_path, reactor, {"iss": "http://127.0.0.1:8080/api/auth", "sub": "alice"})
    verified = jwt.JWT(jwt=token, key=keyset)
    assert json.loads(verified.claims)["sub"] == "alice"


def test_root_redirect_over_http(run_server, tmp_path):
    port = free_port()
    run_server(["authsrv", "--listen", f"tcp:{port}:interface=127.0.0.1"], tmp_path, port=port)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/.well-known/openid-configuration")
    response = connection.getresponse()
    assert response.status == 301
    assert response.getheader("location") == f"http://127.0.0.1:{port}/api/auth/.well-known/openid-configuration"


def test_json_logs(run_server, tmp_path):
    port = free_port()
    server = run_server(["--log-format", "json", "authsrv", "--listen", f"tcp:{port}:interface=127.0.0.1"],
                        tmp_path, port=port)
    out, err = server.stop()
    events = [json.loads(line) for line in (out + err).splitlines() if line.startswith("{")]
    [ready] = [e for e in events if "authsrv ready" in e.get("message", "")]
    assert ready["message"].endswith("; store sqlite, keystore jwk-file, identity static"), ready
    store = str((tmp_path / "authsrv-data" / "authsrv.sqlite3").resolve())
    assert any(e.get("message") == f"SQLite store {store} opened (synchronous = 'full')" for e in events), out + err


def write(tmp_path, text):
    path = tmp_path / "authsrv.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, expected",
    [
        (None, "cannot read config file"),
        ("[server\n", "invalid TOML"),
        ('[server]\nlisten = "tcp:1"\ncolor = "red"\n', "server.color: unknown key"),
        ("[limits]\ncode_ttl = true\n", "limits.code_ttl: must be a duration"),
        ('[store]\nplugin = "redis"\n', "store.plugin: no store plugin named 'redis'; available: postgres, sqlite"),
        ('[keystore]\nplugin = "vault"\n', "keystore.plugin: no keystore plugin named 'vault'; available: jwk-file, pem"),
        ('[store]\nplugin = "sqlite"\nfile = "x"\n', "store.file: unknown key"),
        ('[internal]\nsecret_env = "AUTHSRV_TEST_NOT_SET"\n', "internal.secret_env: environment variable"),
        ('[server]\nlisten = ["nonsense:1"]\n', "server.listen[0]: 'nonsense:1' is not a valid endpoint"),
        ('[server]\nlisten = ["tcp:9:interface=127.0.0.1"]\n[metrics]\nlisten = ["tcp:9:interface=127.0.0.1"]\n',
         "metrics.listen[0]: 'tcp:9:interface=127.0.0.1' binds port 9, as server.listen[0] does"),
        ('[server]\nlisten = ["tcp:99999:interface=127.0.0.1"]\n',
         "server.listen[0]: 'tcp:99999:interface=127.0.0.1' names port 99999; a port is 0 to 65535"),
    ],
)
def test_config_mistakes_stop_with_one_line(run_server, tmp_path, text, expected):
    path = tmp_path / "authsrv.toml"
    if text is not None:
        (tmp_path / "users.toml").write_text("")
        path.write_text(text)
    server = run_server(["authsrv", "--config", str(path)], tmp_path, ready=False)
    out, err = server.output()
    assert server.process.returncode != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("authsrv: ") and expected in lines[0], lines[0]


def test_an_unusable_data_dir_stops_with_one_line(run_server, tmp_path):
    (tmp_path / "a-file").write_text("")
    server = run_server(["authsrv", "--data-dir", "a-file/data"], tmp_path, ready=False)
    out, err = server.output()
    assert server.process.returncode != 0 and "Traceback" not in out + err, out + err
    assert err.strip() == "authsrv: --data-dir: cannot use a-file/data as the data folder: Not a directory"


def test_taken_port_stops_with_one_line(run_server, tmp_path):
    port = free_port()
    first = run_server(["authsrv", "--listen", f"tcp:{port}:interface=127.0.0.1"], tmp_path, port=port)
    second = run_server(["authsrv", "--listen", f"tcp:{first.port}:interface=127.0.0.1"], tmp_path, ready=False)
    out, err = second.output()
    assert second.process.returncode != 0
    assert err.strip().startswith("authsrv: server.listen[0]: cannot listen on")
    assert "Traceback" not in err


def test_version_is_authsrvs_own(capsys):
    """C{twist authsrv --version} answered with Twisted's version alone."""
    with pytest.raises(SystemExit) as exited:
        Options().parseOptions(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"authsrv {version('authsrv')} (Twisted {twisted.__version__})\n"
