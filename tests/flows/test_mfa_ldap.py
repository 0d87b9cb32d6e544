"""
Second factors for users of a read-only LDAP directory (the tests' real
slapd): the factors live in authsrv's store under the directory's stable
id, so enrolment and sign-in need no write to the directory.
"""

from __future__ import annotations

import attrs
import pytest
import pytest_twisted
from treq.testing import StubTreq

from flow_client import Browser, location
from harness import ISSUER, Harness, pkce_pair, query_of
from slapd import user_attributes, user_dn
from test_mfa import claims_of, code_at, enrolment_of, give_code

from authsrv.configsection import Section
from authsrv.identity.ldap import backend as ldap
from authsrv.records import ACR_MFA
from authsrv.service import web_root
from authsrv.testing.identity import ALICE, PASSWORDS

pytestmark = pytest.mark.slow

QUINN = attrs.evolve(ALICE, sub="ldap-quinn-0001", login="quinn.mfa", chat_user_id=None)
QUINN_PASSWORD = PASSWORDS[ALICE.sub]


async def password(browser: Browser, **params):
    response, _ = await browser.authorize("first", **params)
    return await browser.submit_login(response, QUINN.login, QUINN_PASSWORD)


@pytest_twisted.ensureDeferred
async def test_a_directory_user_enrols_and_signs_in_with_totp(tmp_path, monkeypatch, slapd):
    slapd.put(user_dn(QUINN.login), user_attributes(QUINN, QUINN_PASSWORD))
    h = await Harness(tmp_path, monkeypatch, {"mfa": {"required": "required", "enrol_grace": 0}}).start()
    directory = ldap.from_config(Section(slapd.backend_config(), "identity[0]", tmp_path), h.context)
    h.root = web_root(h.config, h.clock, h.store, h.keystore, directory, lambda: None,
                      hash_password=h.hash_password)
    h.http = StubTreq(h.root)
    try:
        browser = Browser(h)
        response, _ = await password(browser)
        assert "/mfa/enrol?" in location(response)
        response, body = await browser.get(location(response))
        secret, _, fields = enrolment_of(body)
        assert b"Not now" not in body and b"quinn.mfa" in body
        response, body = await browser.post(ISSUER + "/mfa/enrol", {**fields, "code": code_at(secret, h.now())})
        assert response.code == 303, body
        assert [f.kind for f in await h.store.list_factors(QUINN.sub)] == ["totp", "recovery"]

        h.clock.advance(30)
        other = Browser(h)
        verifier, challenge = pkce_pair()
        response, _ = await password(other, challenge=challenge)
        response, body = await give_code(other, location(response), code_at(secret, h.now()))
        assert response.code == 303, body
        claims = await claims_of(h, query_of(location(response)), verifier)
        assert claims["sub"] == QUINN.sub and claims["acr"] == ACR_MFA
    finally:
        await directory.close()
        await h.close()
        slapd.delete(user_dn(QUINN.login))
