"""
The config file is validated strictly: every mistake is one ConfigError that
names the dotted key.
"""

from __future__ import annotations

import string
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.logger import LogLevel, capturedLogs, formatEvent

from authsrv.config import ConfigFileError, InputLimits, Limits, load_config, parse_config, read_config_document
from authsrv.configsection import ConfigError, Section, parse_duration
from authsrv.records import ThrottlePolicy
from authsrv.tokens import token_hash

CLIENT = {
    "client_id": "app",
    "redirect_uris": ["https://app.example/cb"],
}


def error_of(data: dict, tmp_path: Path = Path(".")) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, tmp_path / "authsrv.toml")
    return str(caught.value)


def test_defaults():
    config = parse_config({}, None)
    assert config.public_url == "http://127.0.0.1:8080"
    assert config.issuer == "http://127.0.0.1:8080/api/auth"
    assert config.listen == ("tcp:8080:interface=127.0.0.1",)
    assert config.limits == Limits()
    assert (config.store.name, config.keystore.name) == ("sqlite", "jwk-file")
    assert [c.name for c in config.identity] == ["static"]
    assert config.internal_secret is None


def test_an_identity_table_that_names_no_plugin_is_the_static_file():
    """As the README's reference says: plugin = "static" is the default of an [[identity]] table too."""
    config = parse_config({"identity": [{"path": "staff.toml"}, {"plugin": "ldap"}]}, None)
    assert [c.name for c in config.identity] == ["static", "ldap"]
    assert config.identity[0].section.has("path")


@pytest.mark.parametrize(
    "data, message",
    [
        ({"sever": {}}, "sever: unknown section"),
        ({"client": [{"client_id": "x"}]}, "client: unknown section"),
        ({"colour": "red"}, "colour: unknown key"),
        ({"server": {"lisen": "tcp:80"}}, "server.lisen: unknown key"),
        ({"server": {"listen": 8080}}, "server.listen: must be an array of strings, not an integer"),
        ({"server": {"listen": []}}, "server.listen: is empty: the server would listen nowhere"),
        ({"server": {"listen": ["tcp:1", 2]}}, "server.listen[1]: must be a non-empty string, not an integer"),
        ({"server": "x"}, "server: must be a table, not a string"),
        ({"server": {"public_url": "ftp://x"}}, "server.public_url: 'ftp://x' must be an absolute http(s) URL"),
        ({"server": {"public_url": "http://auth.example.com"}}, "server.public_url: must use https"),
        ({"server": {"public_url": "https://a.example/?x=1"}}, "server.public_url: must not have a query"),
        ({"limits": {"code_ttl": "soon"}}, 'limits.code_ttl: must be a duration such as "90s"'),
        ({"limits": {"code_ttl": True}}, "limits.code_ttl: must be a duration"),
        ({"limits": {"access_token_ttl": 0}}, "limits.access_token_ttl: must be longer than zero"),
        ({"limits": {"max_body_bytes": "big"}}, "limits.max_body_bytes: must be an integer, not a string"),
        ({"store": {"plugin": 3}}, "store.plugin: must be a string, not an integer"),
        ({"throttle": {"failures_per_pair": 0}}, "throttle.failures_per_pair: must be at least 1, not 0"),
        ({"passwords": {"argon2_memory_kib": 1024}}, "passwords.argon2_memory_kib: must be at least 7168, not 1024"),
        ({"passwords": {"argon2_time_cost": 0}}, "passwords.argon2_time_cost: must be at least 1, not 0"),
        ({"passwords": {"argon2_parallelism": 64}}, "passwords.argon2_parallelism: must be at most 16, not 64"),
        ({"throttle": {"failures_per_account": "many"}}, "throttle.failures_per_account: must be an integer"),
        ({"throttle": {"window": "soon"}}, 'throttle.window: must be a duration such as "90s"'),
        ({"throttle": {"max_delay": 0}}, "throttle.max_delay: must be longer than zero"),
        ({"throttle": {"failures": 5}}, "throttle.failures: unknown key"),
        ({"identity": [{"plugin": ""}]}, "identity[0].plugin: must not be empty"),
        ({"identity": {"plugin": "static"}}, "identity: must be an array of tables, not a table"),
        ({"identity": [{"plugin": "static"}, {"plugin": 3}]}, "identity[1].plugin: must be a string, not an integer"),
        ({"identity": [{"plugin": "ldap", "standing_cache": "soon"}]}, 'identity[0].standing_cache: must be a duration'),
        ({"identity": [{"plugin": "ldap", "standing_cache": -1}]}, "identity[0].standing_cache: must not be negative"),
        ({"identity": [{"plugin": "ldap", "standing_cache": "61s"}]},
         "identity[0].standing_cache: must be at most 60s, not 61s"),
        ({"identity": [{"plugin": "ldap", "standing_cache_size": 0}]},
         "identity[0].standing_cache_size: must be at least 1, not 0"),
        ({"server": {"workers": 0}}, "server.workers: must be at least 1, not 0"),
        ({"limits": {"access_token_ttl": 2**63 - 1}}, "limits.access_token_ttl: must be at most 3650d"),
        ({"limits": {"refresh_grace": "99999999999999999d"}}, "limits.refresh_grace: must be at most 3650d"),
        ({"server": {"drain_timeout": "3651d"}}, "server.drain_timeout: must be at most 3650d, not 315446400s"),
        ({"throttle": {"failures_per_address": 2**70}}, "throttle.failures_per_address: must be at most 2147483647"),
        ({"limits": {"max_body_bytes": 2**63}}, "limits.max_body_bytes: must be at most 2147483647"),
        ({"server": {"workers": 99999999999}}, "server.workers: must be at most 256, not 99999999999"),
        ({"server": {"workers": "all"}}, "server.workers: must be an integer, not a string"),
        ({"internal": {"secret": "hunter2"}}, "internal.secret: secrets are not written in the config file"),
        ({"clients": [{"redirect_uris": []}]}, "clients[0].client_id: is required"),
        ({"clients": [{**CLIENT, "redirect_uris": ["http://app.example/cb"]}]},
         "clients[0].redirect_uris[0]: 'http://app.example/cb' must use https"),
        ({"clients": [{**CLIENT, "redirect_uris": ["https://app.example/cb#x"]}]},
         "clients[0].redirect_uris[0]: 'https://app.example/cb#x' must not contain a fragment"),
        ({"clients": [{**CLIENT, "client_id": "a b"}]}, "clients[0].client_id: 'a b' may hold only printable ASCII"),
        ({"clients": [CLIENT, CLIENT]}, "clients[1].client_id: 'app' is declared twice"),
        ({"clients": [{**CLIENT, "first_party": "yes"}]}, "clients[0].first_party: must be true or false, not a string"),
        ({"clients": [{**CLIENT, "secret": "s3cret"}]}, "clients[0].secret: secrets are not written"),
        ({"clients": [{**CLIENT, "secret_env": "AUTHSRV_TEST_UNSET_VARIABLE"}]},
         "clients[0].secret_env: environment variable AUTHSRV_TEST_UNSET_VARIABLE is not set or empty"),
    ],
)
def test_mistakes_name_the_key(data, message):
    assert error_of(data).startswith(message)


def test_secrets_from_env_and_file(tmp_path, monkeypatch):
    (tmp_path / "secret").write_text("from-a-file\n")
    monkeypatch.setenv("AUTHSRV_TEST_SECRET", "from-the-env")
    config = parse_config(
        {
            "internal": {"secret_env": "AUTHSRV_TEST_SECRET"},
            "clients": [{**CLIENT, "secret_file": "secret"}],
        },
        tmp_path / "authsrv.toml",
    )
    assert config.internal_secret == "from-the-env"
    assert config.clients[0].secret_hash == token_hash("from-a-file")
    assert not config.clients[0].is_public


def test_secret_file_problems(tmp_path):
    assert "internal.secret_file: cannot read" in error_of({"internal": {"secret_file": "nope"}}, tmp_path)
    (tmp_path / "empty").write_text("\n")
    assert error_of({"internal": {"secret_file": "empty"}}, tmp_path).endswith("empty is empty")
    (tmp_path / "s").write_text("x")
    assert "not both" in error_of({"internal": {"secret_file": "s", "secret_env": "HOME"}}, tmp_path)


def test_a_world_readable_secret_file_is_warned_of(tmp_path):
    secret = tmp_path / "s"
    secret.write_text("x")
    for mode in (0o600, 0o640, 0o644):
        secret.chmod(mode)
        with capturedLogs() as events:
            parse_config({"internal": {"secret_file": "s"}}, tmp_path / "authsrv.toml")
        warnings = [formatEvent(e) for e in events if e["log_level"] == LogLevel.warn]
        if mode & 0o004:
            assert warnings == [f"internal.secret_file: {secret} is readable by every user of this machine"
                                " (mode 0644); chmod 600 it"]
        else:
            assert warnings == []


def test_password_hashing_defaults_and_settings():
    from authsrv.identity.passwords import DEFAULT_HASHER, hasher_of

    default = hasher_of(parse_config({}, None))
    assert (default.memory_cost, default.time_cost, default.parallelism) == (19456, 2, 1)
    assert default.hash(b"x").split("$")[3] == DEFAULT_HASHER.hash(b"x").split("$")[3]
    config = parse_config({"passwords": {"argon2_memory_kib": 47104, "argon2_time_cost": 1}}, None)
    assert hasher_of(config).hash(b"x").startswith("$argon2id$v=19$m=47104,t=1,p=1$")


def test_throttle_defaults_and_settings():
    assert parse_config({}, None).throttle == ThrottlePolicy(
        failures_per_pair=5, failures_per_address=50, failures_per_account=100, window=900, max_delay=900,
    )
    throttle = parse_config(
        {"throttle": {"failures_per_pair": 3, "failures_per_address": 20, "failures_per_account": 40,
                      "window": "1h", "max_delay": "2m"}},
        None,
    ).throttle
    assert throttle == ThrottlePolicy(3, 20, 40, 3600, 120)


def test_client_without_secret_is_public():
    client = parse_config({"clients": [CLIENT]}, None).clients[0]
    assert client.is_public
    assert client.name == "app"


def test_durations():
    assert parse_duration("90d") == 90 * 86400
    assert parse_duration("1h30m") == 5400
    assert parse_duration("45s") == 45
    for bad in ("", "1x", "h", "1.5h", "-3s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    limits = parse_config({"limits": {"code_ttl": 30, "session_ttl": "1d"}}, None).limits
    assert (limits.code_ttl, limits.session_ttl) == (30, 86400)


@settings(deadline=None)
@given(st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=20))
def test_any_unknown_key_is_rejected_and_named(name):
    known = {f.name for f in (*attrs.fields(Limits), *attrs.fields(InputLimits))}
    if name in known:
        return
    with pytest.raises(ConfigError) as caught:
        parse_config({"limits": {name: 1}}, None)
    assert str(caught.value) == f"limits.{name}: unknown key"


@pytest.mark.parametrize("data, keys", [
    ({"dpop": {"enabled": "yes", "max_age": 0, "leeway": "soon"}}, ["dpop.enabled", "dpop.max_age", "dpop.leeway"]),
    ({"par": {"require_pushed_authorization_requests": 1, "enabled": "yes"}},
     ["par.require_pushed_authorization_requests", "par.enabled"]),
    ({"registration": {"enabled": True, "initial_access_token_env": "AUTHSRV_TEST_UNSET",
                       "allowed_redirect_hosts": ["Bad", "*"], "max_clients": 0}},
     ["registration.initial_access_token_env", "registration.allowed_redirect_hosts[0]",
      "registration.allowed_redirect_hosts[1]", "registration.max_clients"]),
    ({"registration": {"enabled": True, "rate": "often"}}, ["registration.rate", "registration.enabled"]),
    ({"remote_documents": {"timeout": 0, "max_bytes": 1, "cache_min": "2d", "cache_max": "1d"}},
     ["remote_documents.timeout", "remote_documents.max_bytes", "remote_documents.cache_max"]),
    ({"mfa": {"required": "sometimes", "recent_sign_in": "1s", "max_passkeys": 0}},
     ["mfa.required", "mfa.recent_sign_in", "mfa.max_passkeys"]),
    ({"mfa": {"max_passkeys": 101}}, ["mfa.max_passkeys"]),
    ({"device": {"code_ttl": "1s", "interval": "2m", "user_code_failures": 0}},
     ["device.code_ttl", "device.interval", "device.user_code_failures"]),
    ({"chat": {"encryption_key_env": "AUTHSRV_TEST_UNSET", "pkce": "yes", "timeout": 0}},
     ["chat.encryption_key_env", "chat.pkce", "chat.timeout"]),
    ({"client_secrets": {"encryption_key_env": "AUTHSRV_TEST_UNSET", "colour": "blue"}},
     ["client_secrets.encryption_key_env", "client_secrets.colour"]),
    ({"dpop": {"colour": "blue", "flavour": "mint"}}, ["dpop.colour", "dpop.flavour"]),
    ({"dpop": {"enabled": "yes"}, "clients": [{**CLIENT, "dpop_bound_access_tokens": True}]}, ["dpop.enabled"]),
    ({"par": {"enabled": 1}, "clients": [{**CLIENT, "require_pushed_authorization_requests": True}]},
     ["par.enabled"]),
])
def test_every_mistake_of_a_section_is_named_at_once(monkeypatch, data, keys):
    """The first mistake of a section leaves its other keys checked, so that one start names them all."""
    monkeypatch.delenv("AUTHSRV_TEST_UNSET", raising=False)
    _, errors = read_config_document(data, None)
    assert [e.key for e in errors] == keys


@pytest.mark.parametrize("clients, messages", [
    ([{"client_id": "a b", "first_party": "yes", "colour": "blue",
       "redirect_uris": ["http://app.example/cb", "https://app.example/cb#x"],
       "grant_types": ["implicit", "refresh_token", "refresh_token"]}],
     ["clients[0].client_id: 'a b' may hold only printable ASCII",
      "clients[0].first_party: must be true or false, not a string",
      "clients[0].redirect_uris[0]: 'http://app.example/cb' must use https",
      "clients[0].redirect_uris[1]: 'https://app.example/cb#x' must not contain a fragment",
      "clients[0].grant_types[0]: 'implicit' is not a grant type this server offers",
      "clients[0].grant_types[2]: 'refresh_token' is listed twice",
      "clients[0].colour: unknown key"]),
    ([{"redirect_uris": [], "secret": "s3cret", "rate_limit": "often", "profile": "strict"}],
     ["clients[0].client_id: is required", "clients[0].secret: secrets are not written in the config file",
      "clients[0].rate_limit: ", "clients[0].profile: must be one of"]),
    ([{**CLIENT, "rate_limit": "often"}, {**CLIENT, "client_id": "other", "refresh_grace": "soon"}],
     ["clients[0].rate_limit: ", "clients[1].refresh_grace: must be a duration"]),
    ([{**CLIENT, "secret_env": "AUTHSRV_TEST_UNSET", "token_endpoint_auth_method": "client_secret_basic"}],
     ["clients[0].secret_env: environment variable AUTHSRV_TEST_UNSET is not set or empty"]),
])
def test_every_mistake_of_a_client_entry_is_named_at_once(monkeypatch, clients, messages):
    """
    Each key of a [[clients]] entry is checked on its own, messages as ever;
    the keys are checked against each other only once each is right, so a
    secret that cannot be read is not blamed again on the auth method.
    """
    monkeypatch.delenv("AUTHSRV_TEST_UNSET", raising=False)
    _, errors = read_config_document({"clients": clients}, None)
    assert len(errors) == len(messages), errors
    for error, message in zip(errors, messages):
        assert str(error).startswith(message), (str(error), message)


def test_a_plugin_section_names_every_unknown_key():
    """A plugin's section is read by the plugin, whose one error names each key nobody asked for."""
    section = Section({"plugin": "sqlite", "colour": "blue", "flavour": "mint"}, "store", Path("."))
    section.str("plugin")
    with pytest.raises(ConfigError) as caught:
        section.done()
    assert str(caught.value) == "store.colour: unknown key (also unknown: store.flavour)"


def test_the_standing_cache_is_taken_before_the_plugin_reads_its_section(tmp_path):
    config = parse_config({"identity": [{"plugin": "ldap", "standing_cache": "1m", "standing_cache_size": 50},
                                        {"plugin": "static"}]}, tmp_path / "a.toml")
    first, second = config.identity
    assert (first.standing_cache, first.standing_cache_size) == (60, 50)
    assert second.standing_cache is None and config.workers == 1
    first.section.done()


def test_plugin_sections_are_kept_for_the_plugin(tmp_path):
    config = parse_config({"store": {"plugin": "sqlite", "path": "x.db"}}, tmp_path / "a.toml")
    section = config.store.section
    assert isinstance(section, Section)
    assert section.path_("path") == (tmp_path / "x.db").resolve()
    section.done()


def test_load_config_file_problems(tmp_path):
    with pytest.raises(ConfigFileError, match=r"cannot read config file .*missing.toml: No such file"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\nlisten = 1\n")
    with pytest.raises(ConfigFileError, match=r"bad.toml: invalid TOML: .*line 1"):
        load_config(bad)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[server]\nlisten = "tcp:1"\ncolour = "blue"\n')
    with pytest.raises(ConfigFileError) as caught:
        load_config(unknown)
    assert str(caught.value) == f"{unknown}: server.colour: unknown key"
    assert "\n" not in str(caught.value)


def test_a_byte_order_mark_is_read_past(tmp_path):
    """
    Windows editors may begin a UTF-8 file with one: the config was refused
    as "invalid TOML: Invalid statement (at line 1, column 1)", and a secret
    file's became the secret's first character, a secret nobody else has.
    """
    (tmp_path / "secret").write_bytes(b"\xef\xbb\xbffrom-a-file\n")
    path = tmp_path / "authsrv.toml"
    path.write_bytes(b'\xef\xbb\xbf[[clients]]\nclient_id = "app"\nredirect_uris = ["https://app.example/cb"]\n'
                     b'secret_file = "secret"\n')
    assert load_config(path).clients[0].secret_hash == token_hash("from-a-file")


def test_demo_config_is_valid():
    demo = Path(__file__).parent.parent / "examples" / "demo.toml"
    config = load_config(demo)
    assert config.internal_secret == "demo-internal-secret"
    clients = {c.client_id: c for c in config.clients}
    assert clients["demo-app"].secret_hash == token_hash("demo-app-secret")
    assert clients["demo-app"].first_party and clients["demo-app"].end_session_enabled
    assert clients["demo-app"].resources == ("https://api.demo.test",)
    assert not clients["partner-app"].first_party
    assert clients["partner-app"].post_logout_redirect_uris == ("http://127.0.0.1:9001/",)
    assert clients["demo-spa"].is_public
    assert clients["api-gateway"].introspect_any


@pytest.mark.parametrize(
    "grant_types, message",
    [
        ([], "clients[0].grant_types: must name at least one grant type"),
        (["password"], "clients[0].grant_types[0]: 'password' is not a grant type this server offers"),
        (["authorization_code", "authorization_code"], "clients[0].grant_types[1]: 'authorization_code' is listed twice"),
        ([3], "clients[0].grant_types[0]: must be a non-empty string, not an integer"),
    ],
)
def test_client_grant_types_are_checked(grant_types, message):
    assert message in error_of({"clients": [dict(CLIENT, grant_types=grant_types)]})


def test_client_grant_types_default_to_code_and_refresh():
    (default,) = parse_config({"clients": [CLIENT]}, None).clients
    assert default.grant_types == ("authorization_code", "refresh_token")
    (limited,) = parse_config({"clients": [dict(CLIENT, grant_types=["authorization_code"])]}, None).clients
    assert limited.grant_types == ("authorization_code",)


def test_trusted_proxies_are_addresses_or_blocks():
    config = parse_config({"server": {"trusted_proxies": ["127.0.0.1", "10.0.0.0/8", "::1"]}}, None)
    assert [str(n) for n in config.trusted_proxies] == ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]
    assert error_of({"server": {"trusted_proxies": ["10.0.0.0/8", "proxy.local"]}}) == (
        "server.trusted_proxies[1]: 'proxy.local' is not an IP address or CIDR block"
    )
    assert parse_config({}, None).trusted_proxies == ()
