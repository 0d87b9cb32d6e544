"""
The device's and the person's sides of the device authorization grant
(RFC 8628) over L{harness.Harness}, for the flow and audit tests.
"""

from __future__ import annotations

import re

from authsrv.testing.identity import ALICE, PASSWORDS
from flow_client import Browser, hidden_fields, location
from harness import CLIENTS, ISSUER, Harness
from token_helpers import TOKEN, post_form

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
DEVICE_AUTHORIZATION = "/api/auth/oauth2/device-authorization"
TV = {"client_id": "tv", "name": "Living-Room TV", "redirect_uris": ["http://127.0.0.1:9009/unused"],
      "grant_types": [DEVICE_GRANT, "refresh_token"]}
CONSOLE = {"client_id": "console", "name": "Game Console", "secret_env": "AUTHSRV_TEST_PARTNER_SECRET",
           "redirect_uris": ["http://127.0.0.1:9010/unused"], "grant_types": [DEVICE_GRANT]}
USER_CODE = re.compile(r"^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$")
CONSOLE_SECRET = "partner-secret-H5j2Nc8Rw4Tq9Lm3Xv7"


def harness(tmp_path, monkeypatch, **device) -> Harness:
    config: dict = {"clients": [*CLIENTS, TV, CONSOLE]}
    if device:
        config["device"] = device
    return Harness(tmp_path, monkeypatch, config)


async def start(h, client_id="tv", scope="openid profile offline_access", **extra) -> dict:
    fields = {"client_id": client_id, "scope": scope, **extra}
    if client_id == "console":
        fields["client_secret"] = CONSOLE_SECRET
    response, body = await h.json("POST", DEVICE_AUTHORIZATION, data=fields)
    assert response.code == 200, body
    assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
    return body


async def poll(h, device_code: str, client_id="tv"):
    data = {"grant_type": DEVICE_GRANT, "device_code": device_code, "client_id": client_id}
    if client_id == "console":
        data["client_secret"] = CONSOLE_SECRET
    return await post_form(h, TOKEN, data, None)


def error_of(answer) -> str:
    response, body = answer
    assert response.code == 400, body
    return body["error"]


async def approve(h, browser: Browser, codes: dict, user=ALICE, action="approve") -> bytes:
    """The person's side: the verification page, sign-in if asked, then allow or deny."""
    response, body = await browser.get(codes["verification_uri_complete"])
    if response.code == 303 and "/login?" in location(response):
        response, body = await browser.submit_login(response, user.login, PASSWORDS[user.sub])
        assert response.code == 303 and location(response) == codes["verification_uri_complete"]
        response, body = await browser.get(location(response))
    assert response.code == 200, body
    fields = hidden_fields(body)
    response, body = await browser.post(ISSUER + "/device", {**fields, "action": action})
    assert response.code == 200, body
    return body
