"""
The FAPI 2.0 profile switch (docs/fapi2.md): which client settings it
demands, how a setting this build lacks is refused rather than ignored, and
where the demands are checked (config file, admin operations).
"""

from __future__ import annotations

import attrs
import pytest
import pytest_twisted
from attrs import frozen
from twisted.internet.task import Clock

from authsrv.config import parse_config
from authsrv.configsection import ConfigError
from authsrv.operations.clients import ClientOperations
from authsrv.operations.errors import InvalidInput
from authsrv.protocol.client_assertion import ASSERTION_ALGS
from authsrv.protocol.profiles import FAPI2, assertion_algorithms, code_ttl_for, profile_problems
from authsrv.protocol.pushed import must_push
from authsrv.records import Client
from authsrv.testing.memory import MemoryStore
from authsrv.tokens import token_hash


@frozen
class KeyedClient(Client):
    """A client as it will be once key-based authentication, DPoP and per-client algorithms are merged."""

    token_endpoint_auth_method: str = "client_secret_basic"
    dpop_bound_access_tokens: bool = False
    id_token_signed_response_alg: str = "RS256"
    access_token_signed_response_alg: str = "RS256"
    userinfo_signed_response_alg: str | None = None


MEETS = KeyedClient(
    "bank-app", token_hash("secret"), ["https://bank.example/cb"], profile=FAPI2,
    token_endpoint_auth_method="private_key_jwt", dpop_bound_access_tokens=True,
    id_token_signed_response_alg="PS256", access_token_signed_response_alg="ES256",
)


def test_a_client_with_every_demanded_setting_meets_fapi2():
    assert profile_problems(MEETS) == []
    assert profile_problems(attrs.evolve(MEETS, userinfo_signed_response_alg="ES256")) == []
    assert profile_problems(attrs.evolve(MEETS, redirect_uris=["http://127.0.0.1:8400/cb", "http://[::1]/cb"])) == []
    assert must_push(MEETS, everyone=False)
    assert profile_problems(attrs.evolve(MEETS, profile=None, secret_hash=None)) == []
    assert not must_push(attrs.evolve(MEETS, profile=None), everyone=False)


def test_a_client_proving_nothing_but_its_id_is_named_public():
    """Without a secret or keys a client is public, which FAPI 2.0 refuses (a private_key_jwt client needs no secret)."""
    problems = profile_problems(attrs.evolve(MEETS, secret_hash=None, token_endpoint_auth_method=None))
    assert ("public" in [name for name, _ in problems]) and all("FAPI 2.0" in text for _, text in problems)
    assert profile_problems(attrs.evolve(MEETS, secret_hash=None)) == []


@pytest.mark.parametrize("changes, setting", [
    ({"token_endpoint_auth_method": "client_secret_basic"}, "token_endpoint_auth_method"),
    ({"token_endpoint_auth_method": "client_secret_jwt"}, "token_endpoint_auth_method"),
    ({"dpop_bound_access_tokens": False}, "dpop_bound_access_tokens"),
    ({"id_token_signed_response_alg": "RS256"}, "id_token_signed_response_alg"),
    ({"id_token_signed_response_alg": "EdDSA"}, "id_token_signed_response_alg"),
    ({"access_token_signed_response_alg": "RS256"}, "access_token_signed_response_alg"),
    ({"userinfo_signed_response_alg": "RS256"}, "userinfo_signed_response_alg"),
    ({"redirect_uris": ["https://bank.example/cb", "http://bank.example/cb"]}, "redirect_uris"),
])
def test_each_setting_short_of_fapi2_is_named(changes, setting):
    problems = profile_problems(attrs.evolve(MEETS, **changes))
    assert [name for name, _ in problems] == [setting]
    assert "FAPI 2.0" in problems[0][1]


def test_a_setting_this_build_lacks_refuses_the_profile_instead_of_weakening_it():
    bare = Client("bank-app", token_hash("secret"), ["https://bank.example/cb"], profile=FAPI2)
    missing = [name for name, problem in profile_problems(bare) if "no such client setting" in problem]
    have = attrs.fields_dict(Client)
    assert missing == [name for name in ("token_endpoint_auth_method", "dpop_bound_access_tokens",
                                         "id_token_signed_response_alg", "access_token_signed_response_alg",
                                         "userinfo_signed_response_alg") if name not in have]
    assert profile_problems(bare), "a plain client never passes as FAPI 2.0"


def test_codes_of_a_fapi2_client_live_at_most_a_minute():
    assert code_ttl_for(MEETS, 300) == 60
    assert code_ttl_for(MEETS, 30) == 30
    assert code_ttl_for(attrs.evolve(MEETS, profile=None), 300) == 300


def test_a_fapi2_clients_assertions_may_not_use_rs256():
    assert assertion_algorithms(MEETS) == ("PS256", "ES256", "EdDSA")
    assert assertion_algorithms(attrs.evolve(MEETS, profile=None)) == ASSERTION_ALGS
    assert "RS256" in ASSERTION_ALGS


def test_the_config_file_names_every_shortfall_of_a_fapi2_client():
    client = {"client_id": "bank-app", "redirect_uris": ["https://bank.example/cb"], "profile": "fapi2"}
    with pytest.raises(ConfigError) as caught:
        parse_config({"clients": [client]}, None)
    keys = [error.key for error in caught.value.errors]
    assert keys[0] == "clients[0].profile" and "[par] enabled" in caught.value.errors[0].problem
    assert "clients[0].public" in keys
    assert {k for k in keys if k.startswith("clients[0].") and k not in ("clients[0].profile", "clients[0].public")} == {
        f"clients[0].{name}" for name, problem in profile_problems(Client("x", None, [], profile=FAPI2))
        if name != "public"
    }
    with pytest.raises(ConfigError) as caught:
        parse_config({"clients": [{**client, "profile": "fapi1"}], "par": {"enabled": True}}, None)
    assert caught.value.key == "clients[0].profile"
    strict = {"client_id": "bank-app", "redirect_uris": ["https://bank.example/cb"],
              "require_pushed_authorization_requests": True}
    with pytest.raises(ConfigError) as caught:
        parse_config({"clients": [strict]}, None)
    assert caught.value.key == "clients[0].require_pushed_authorization_requests"
    config = parse_config({"clients": [strict], "par": {"enabled": True}}, None)
    assert config.clients[0].require_pushed_authorization_requests and config.par.enabled
    assert config.clients[0].profile is None
    assert parse_config({"clients": [{**strict, "profile": "none"}], "par": {"enabled": True}}, None).clients == (
        config.clients)


@pytest_twisted.ensureDeferred
async def test_admin_operations_refuse_what_the_server_cannot_hold_a_client_to():
    store = MemoryStore()
    new = {"client_id": "bank-app", "redirect_uris": ["https://bank.example/cb"]}
    for offered in (False, True):
        ops = ClientOperations(store=store, clock=Clock(), declared=frozenset(), resolve=None, pushed_offered=offered)
        with pytest.raises(InvalidInput) as caught:
            await ops.create({**new, "profile": "fapi2"}, actor="test")
        assert caught.value.field == ("profile" if not offered else "token_endpoint_auth_method")
        with pytest.raises(InvalidInput) as caught:
            await ops.create({**new, "profile": "fapi1"}, actor="test")
        assert caught.value.field == "profile"
    ops = ClientOperations(store=store, clock=Clock(), declared=frozenset(), resolve=None, pushed_offered=False)
    with pytest.raises(InvalidInput) as caught:
        await ops.create({**new, "require_pushed_authorization_requests": True}, actor="test")
    assert caught.value.field == "require_pushed_authorization_requests"
    ops = ClientOperations(store=store, clock=Clock(), declared=frozenset(), resolve=None, pushed_offered=True)
    client, _ = await ops.create({**new, "require_pushed_authorization_requests": True}, actor="test")
    assert (await store.get_client("bank-app")).require_pushed_authorization_requests
    changed = await ops.update("bank-app", {"require_pushed_authorization_requests": False}, actor="test")
    assert not changed.require_pushed_authorization_requests
