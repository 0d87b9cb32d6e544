"""
Every audit event of a request names that request's client address, the
forwarded one behind a trusted proxy (docs/audit.md, the C{address} field):
consent, device authorization and pushed requests.
"""

from __future__ import annotations

import pytest_twisted

from authsrv.testing.identity import ALICE, BOB
from device_helpers import CONSOLE, TV, approve, start
from flow_client import Browser
from harness import CLIENTS, Harness
from test_pushed_requests import OFFERED, by_reference, push, request_fields
from token_helpers import client_auth

PROXY = {"server": {"trusted_proxies": ["127.0.0.1"]}}
CLIENT = "203.0.113.7"
FORWARDED = {"X-Forwarded-For": CLIENT}


class ForwardedBrowser(Browser):
    """A browser behind the trusted proxy: every request carries its address in X-Forwarded-For."""

    async def request(self, method: str, url: str, **kwargs):
        return await super().request(method, url, headers=FORWARDED, **kwargs)


async def started(tmp_path, monkeypatch, config: dict) -> Harness:
    return await Harness(tmp_path, monkeypatch, {**config, **PROXY}).start()


def addresses(audit, kind: str) -> list:
    return [event.get("address") for event in audit.of(kind)]


@pytest_twisted.ensureDeferred
async def test_consent_given_and_denied_name_the_browsers_address(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch, {})
    try:
        for user, action, kind in ((ALICE, "approve", "consent.given"), (BOB, "deny", "consent.denied")):
            assert await ForwardedBrowser(h).sign_in(user, "partner", consent=action)
            assert addresses(audit, kind) == [CLIENT], kind
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_device_events_name_the_devices_and_the_browsers_address(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch, {"clients": [*CLIENTS, TV, CONSOLE]})
    try:
        response, codes = await h.json("POST", "/api/auth/oauth2/device-authorization", headers={
            "X-Forwarded-For": "198.51.100.20"}, data={"client_id": "tv", "scope": "openid"})
        assert response.code == 200, codes
        assert addresses(audit, "device.requested") == ["198.51.100.20"]
        await approve(h, ForwardedBrowser(h), codes)
        assert addresses(audit, "device.approved") == [CLIENT], "the browser's, not the device's"
        await approve(h, ForwardedBrowser(h), await start(h), action="deny")
        assert addresses(audit, "device.denied") == [CLIENT]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_pushed_and_refused_request_uris_name_their_callers_address(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch, OFFERED)
    try:
        fields, _ = request_fields("first")
        auth_fields, auth_headers = client_auth("first", "post")
        response, body = await h.json("POST", "/api/auth/oauth2/par", data={**fields, **auth_fields},
                                      headers={**auth_headers, "X-Forwarded-For": "198.51.100.30"})
        assert response.code == 201, body
        assert addresses(audit, "request.pushed") == ["198.51.100.30"]
        request_uri, _ = await push(h)
        browser = ForwardedBrowser(h)
        assert (await browser.get(by_reference("first", request_uri)))[0].code == 303
        response, _ = await browser.get(by_reference("first", request_uri))
        assert response.code == 400, "used up"
        assert addresses(audit, "request_uri.refused") == [CLIENT]
    finally:
        await h.close()

