"""A rotated-out client secret keeps working until its overlap ends, and not after."""

from __future__ import annotations

import pytest

from authsrv.protocol.clientauth import ClientCredentials, authenticate
from authsrv.protocol.errors import InvalidClient
from authsrv.records import Client
from authsrv.tokens import client_secret_hash, token_hash

KEY = bytes(range(32))
NOW = 1_800_000_000


def _post(secret: str) -> ClientCredentials:
    return ClientCredentials("web", secret, "client_secret_post")


def _rotated(previous_hash: str | None, until: int | None) -> Client:
    return Client(
        client_id="web", secret_hash=client_secret_hash("new-secret", KEY), redirect_uris=["https://a.example/cb"],
        previous_secret_hash=previous_hash, previous_secret_until=until,
    )


@pytest.mark.parametrize("previous", [client_secret_hash("old-secret", KEY), token_hash("old-secret")])
def test_both_secrets_work_during_the_overlap_and_only_the_new_one_after(previous):
    client = _rotated(previous, NOW + 10)
    assert authenticate(client, _post("new-secret"), KEY, NOW) is client
    assert authenticate(client, _post("old-secret"), KEY, NOW + 9) is client
    with pytest.raises(InvalidClient):
        authenticate(client, _post("old-secret"), KEY, NOW + 10)
    assert authenticate(client, _post("new-secret"), KEY, NOW + 10) is client
    with pytest.raises(InvalidClient):
        authenticate(client, _post("other"), KEY, NOW)


def test_a_previous_hash_without_an_end_is_never_accepted():
    client = _rotated(client_secret_hash("old-secret", KEY), None)
    with pytest.raises(InvalidClient):
        authenticate(client, _post("old-secret"), KEY, NOW)
    assert authenticate(_rotated(None, NOW + 10), _post("new-secret"), KEY, NOW).client_id == "web"
