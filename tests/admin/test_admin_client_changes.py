"""
C{client update} and C{client rotate-secret}: the operator command changes a
client in place, through the same operations as the admin API, and audits it.
"""

from __future__ import annotations

import json
import sqlite3

import pytest_twisted
from jwcrypto import jwk

from authsrv.protocol.clientauth import ClientCredentials, authenticate
from authsrv.protocol.errors import InvalidClient
from authsrv.records import Client

from conftest import admin, ok, refused


async def _add(cwd, config) -> str:
    out = ok(await admin("--config", config, "client", "add", "web", "--redirect-uri", "https://shop.example/cb",
                         "--resource", "https://api.example", cwd=cwd))
    return out.split("client_secret:")[1].strip()


def _stored(cwd) -> tuple[dict, bytes]:
    database = sqlite3.connect(cwd / "data" / "authsrv.sqlite3")
    database.row_factory = sqlite3.Row
    row = dict(database.execute("SELECT * FROM clients WHERE client_id = 'web'").fetchone())
    key = database.execute("SELECT key FROM server_keys WHERE name = 'client-secrets'").fetchone()[0]
    return row, key


def _accepts(row: dict, key: bytes, secret: str, now: int) -> bool:
    client = Client(
        client_id="web", secret_hash=row["secret_hash"], redirect_uris=["https://shop.example/cb"],
        previous_secret_hash=row["previous_secret_hash"], previous_secret_until=row["previous_secret_until"],
    )
    try:
        authenticate(client, ClientCredentials("web", secret, "client_secret_post"), key, now)
    except InvalidClient:
        return False
    return True


@pytest_twisted.ensureDeferred
async def test_client_update_changes_only_the_given_settings(deployment):
    cwd, config = deployment
    await _add(cwd, config)
    changed = await admin("--config", config, "client", "update", "web", "--name", "Web Shop", "--first-party",
                          "--redirect-uri", "https://shop.example/new", "--rate-limit", "5/s",
                          "--refresh-grace", "30s", "--grant-type", "authorization_code", cwd=cwd)
    ok(changed)
    assert [json.loads(line)["event"] for line in changed.stderr.splitlines()] == ["client.changed"]
    assert json.loads(changed.stderr)["actor"] == "operator"
    shown = json.loads(ok(await admin("--config", config, "client", "show", "web", "--json", cwd=cwd)))
    assert (shown["name"], shown["first_party"], shown["redirect_uris"], shown["rate_limit"],
            shown["refresh_grace"], shown["grant_types"], shown["resources"]) == (
        "Web Shop", True, ["https://shop.example/new"], "5/s", 30, ["authorization_code"], ["https://api.example"])
    ok(await admin("--config", config, "client", "update", "web", "--no-first-party", "--clear", "resources",
                   "--clear", "rate-limit", cwd=cwd))
    shown = json.loads(ok(await admin("--config", config, "client", "show", "web", "--json", cwd=cwd)))
    assert (shown["first_party"], shown["resources"], shown["rate_limit"], shown["name"]) == (
        False, [], None, "Web Shop")


@pytest_twisted.ensureDeferred
async def test_a_client_may_require_a_second_factor(deployment):
    cwd, config = deployment
    ok(await admin("--config", config, "client", "add", "web", "--redirect-uri", "https://shop.example/cb",
                   "--require-mfa", cwd=cwd))
    assert json.loads(ok(await admin("--config", config, "client", "show", "web", "--json", cwd=cwd)))["require_mfa"]
    ok(await admin("--config", config, "client", "update", "web", "--no-require-mfa", cwd=cwd))
    assert not json.loads(ok(await admin("--config", config, "client", "show", "web", "--json",
                                         cwd=cwd)))["require_mfa"]


@pytest_twisted.ensureDeferred
async def test_client_update_refuses(deployment):
    cwd, config = deployment
    await _add(cwd, config)
    refused(await admin("--config", config, "client", "update", "web", cwd=cwd), "nothing to change")
    refused(await admin("--config", config, "client", "update", "nobody", "--name", "x", cwd=cwd), "no client 'nobody'")
    refused(await admin("--config", config, "client", "update", "web", "--redirect-uri", "http://shop.example/cb",
                        cwd=cwd), "--redirect-uri: 'http://shop.example/cb' must use https")
    refused(await admin("--config", config, "client", "update", "web", "--rate-limit", "fast", cwd=cwd),
            "--rate-limit:")
    grace = await admin("--config", config, "client", "update", "web", "--refresh-grace", "soon", cwd=cwd)
    refused(grace, "--refresh-grace must be seconds (a whole number) or a duration such as 30s, up to 365d")
    assert "null" not in grace.stderr, "the command has no null: --clear refresh-grace empties it"
    refused(await admin("--config", config, "client", "update", "web", "--jwks", "no-such.jwks", cwd=cwd),
            "--jwks: cannot read no-such.jwks: No such file or directory")
    refused(await admin("--config", config, "client", "update", "web", "--backchannel-logout-uri",
                        "https://169.254.169.254/x", cwd=cwd), "cloud metadata address")


@pytest_twisted.ensureDeferred
async def test_rotate_secret_keeps_the_old_one_for_the_overlap(deployment):
    cwd, config = deployment
    old = await _add(cwd, config)
    rotated = await admin("--config", config, "client", "rotate-secret", "web", "--overlap", "2h", cwd=cwd)
    out = ok(rotated)
    new = out.split("client_secret:")[1].split("\n")[0].strip()
    assert len(new) >= 43 and new != old and "previous secret works until 20" in out
    audit = [json.loads(line) for line in rotated.stderr.splitlines() if line.startswith("{")]
    assert [e["event"] for e in audit] == ["client.secret_rotated"] and audit[0]["actor"] == "operator"
    row, key = _stored(cwd)
    until = row["previous_secret_until"]
    assert _accepts(row, key, old, until - 1) and _accepts(row, key, new, until - 1)
    assert not _accepts(row, key, old, until) and _accepts(row, key, new, until)

    out = ok(await admin("--config", config, "client", "rotate-secret", "web", "--overlap", "0s", cwd=cwd))
    assert "the previous secret no longer works" in out
    newest = out.split("client_secret:")[1].split("\n")[0].strip()
    row, key = _stored(cwd)
    assert row["previous_secret_hash"] is None
    assert _accepts(row, key, newest, 0) and not _accepts(row, key, new, 0)
    refused(await admin("--config", config, "client", "rotate-secret", "web", "--overlap", "soon", cwd=cwd),
            "is not a duration")
    ok(await admin("--config", config, "client", "add", "spa", "--public", "--redirect-uri", "https://spa.example/cb",
                   cwd=cwd))
    refused(await admin("--config", config, "client", "rotate-secret", "spa", cwd=cwd), "is public")


@pytest_twisted.ensureDeferred
async def test_client_signing_algorithms(deployment):
    """Only what [keystore] algorithms and [userinfo] signing offer; refusals name the option."""
    cwd, config = deployment
    await _add(cwd, config)
    refused(await admin("--config", config, "client", "update", "web", "--id-token-alg", "ES256", cwd=cwd),
            "--id-token-alg: ES256 is not offered by this server: add it to [keystore] algorithms")
    refused(await admin("--config", config, "client", "update", "web", "--userinfo-alg", "RS256", cwd=cwd),
            "--userinfo-alg: needs signed UserInfo responses")
    with open(config) as file:
        text = file.read()
    with open(config, "w") as file:
        file.write(text.replace('path = "keys.jwks.json"\n', 'path = "keys.jwks.json"\nalgorithms = ["RS256", "ES256"]\n')
                   + "\n[userinfo]\nsigning = true\n")
    ok(await admin("--config", config, "client", "update", "web", "--id-token-alg", "ES256",
                   "--userinfo-alg", "ES256", cwd=cwd))
    shown = json.loads(ok(await admin("--config", config, "client", "show", "web", "--json", cwd=cwd)))
    assert (shown["id_token_signed_response_alg"], shown["access_token_signed_response_alg"],
            shown["userinfo_signed_response_alg"]) == ("ES256", "RS256", "ES256")
    ok(await admin("--config", config, "client", "update", "web", "--clear", "userinfo-alg", cwd=cwd))
    row, _ = _stored(cwd)
    assert (row["id_token_signed_response_alg"], row["userinfo_signed_response_alg"]) == ("ES256", None)


@pytest_twisted.ensureDeferred
async def test_dpop_bound_and_fapi2_clients_need_dpop_offered(deployment, tmp_path):
    """--require-dpop, and the FAPI 2.0 profile that demands it, are refused while [dpop] is off."""
    cwd, config = deployment
    await _add(cwd, config)
    unoffered = "--require-dpop needs DPoP offered: set [dpop] enabled = true"
    refused(await admin("--config", config, "client", "add", "api", "--redirect-uri", "https://api.example/cb",
                        "--require-dpop", cwd=cwd), unoffered)
    refused(await admin("--config", config, "client", "update", "web", "--require-dpop", cwd=cwd), unoffered)
    key = jwk.JWK.generate(kty="EC", crv="P-256", kid="bank-1")
    (tmp_path / "bank.jwks").write_text(json.dumps({"keys": [key.export_public(as_dict=True)]}))
    with open(config) as file:
        text = file.read()
    with open(config, "w") as file:
        file.write(text.replace('path = "keys.jwks.json"\n',
                                'path = "keys.jwks.json"\nalgorithms = ["RS256", "ES256"]\n')
                   + "\n[par]\nenabled = true\n")
    fapi2 = ("--config", config, "client", "add", "bank", "--redirect-uri", "https://bank.example/cb",
             "--profile", "fapi2", "--require-dpop", "--auth-method", "private_key_jwt",
             "--jwks", str(tmp_path / "bank.jwks"), "--id-token-alg", "ES256", "--access-token-alg", "ES256")
    refused(await admin(*fapi2, cwd=cwd), unoffered)
    with open(config, "a") as file:
        file.write("\n[dpop]\nenabled = true\n")
    ok(await admin(*fapi2, cwd=cwd))
    ok(await admin("--config", config, "client", "update", "web", "--require-dpop", cwd=cwd))
    for client_id in ("bank", "web"):
        shown = json.loads(ok(await admin("--config", config, "client", "show", client_id, "--json", cwd=cwd)))
        assert shown["dpop_bound_access_tokens"] is True
