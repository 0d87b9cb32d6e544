"""
Passkeys in a real browser: headless chromium with its virtual authenticator
(DevTools WebAuthn domain: CTAP2, internal transport, resident keys, user
verification) against a real `twist authsrv` whose public URL is
http://localhost (a secure context, and a host a relying party id may be).
A user without a session opens the account page and is sent to sign in and
back, registers a passkey there, signs in with it instead of a password, is
refused with a clone whose counter went back, and, signing in at the account
page with the passkey as the second factor, removes it again.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from urllib.parse import urlencode

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait
from test_browser import (  # noqa: F401  (fixtures)
    PASSWORD,
    WAIT,
    _browser_installed,
    authorize_url,
    callback,
    carol_server,
    driver,
    landed,
    sign_in,
)

from harness import pkce_pair

pytestmark = pytest.mark.slow


@pytest.fixture
def server(run_server, tmp_path, callback):  # noqa: F811
    return carol_server(run_server, tmp_path, [
        {"client_id": "web", "name": "First Web", "first_party": True, "redirect_uris": [callback + "/first"]},
    ], host="localhost")


def virtual_authenticator(driver) -> str:  # noqa: F811
    driver.execute_cdp_cmd("WebAuthn.enable", {})
    return driver.execute_cdp_cmd("WebAuthn.addVirtualAuthenticator", {"options": {
        "protocol": "ctap2", "transport": "internal", "hasResidentKey": True, "hasUserVerification": True,
        "isUserVerified": True, "automaticPresenceSimulation": True,
    }})["authenticatorId"]


def credentials(driver, authenticator: str) -> list[dict]:  # noqa: F811
    return driver.execute_cdp_cmd("WebAuthn.getCredentials", {"authenticatorId": authenticator})["credentials"]


def status_text(driver) -> str:  # noqa: F811
    WebDriverWait(driver, WAIT).until(expected_conditions.presence_of_element_located(
        (By.CSS_SELECTOR, "p[role=status].notice")))
    return driver.find_element(By.CSS_SELECTOR, "p[role=status].notice").text


def signed_out(driver, server) -> None:  # noqa: F811
    """The service's cookies gone, as for a new browser."""
    driver.get(server.base + "/api/auth/.well-known/openid-configuration")
    driver.delete_all_cookies()


def use_passkey(driver) -> None:  # noqa: F811
    WebDriverWait(driver, WAIT).until(expected_conditions.visibility_of_element_located(
        (By.CSS_SELECTOR, "#passkey button")))
    driver.find_element(By.CSS_SELECTOR, "#passkey button").click()


def passkey_sign_in(driver, server, callback, state: str, challenge: str | None = None) -> None:  # noqa: F811
    """A new browser session asks to sign in and chooses the passkey."""
    signed_out(driver, server)
    driver.get(authorize_url(server, "web", callback + "/first", state)
               if challenge is None else with_challenge(server, callback, state, challenge))
    use_passkey(driver)


def account_signed_in(driver, issuer: str, second_factor: bool = False) -> None:  # noqa: F811
    """A browser without a session opens the account page: the empty login form, then back to the page."""
    driver.get(issuer + "/account")
    WebDriverWait(driver, WAIT).until(expected_conditions.presence_of_element_located((By.NAME, "username")))
    assert driver.find_element(By.NAME, "username").get_attribute("value") == ""
    sign_in(driver, "carol", PASSWORD)
    if second_factor:
        WebDriverWait(driver, WAIT).until(lambda d: d.current_url.startswith(issuer + "/mfa?"))
        use_passkey(driver)
    WebDriverWait(driver, WAIT).until(lambda d: d.current_url == issuer + "/account")


def with_challenge(server, callback, state: str, challenge: str) -> str:  # noqa: F811
    return f"{server.base}/api/auth/oauth2/authorize?" + urlencode({
        "response_type": "code", "client_id": "web", "redirect_uri": callback + "/first", "scope": "openid",
        "state": state, "code_challenge": challenge, "code_challenge_method": "S256",
    })


def id_token_claims(server, callback, code: str, verifier: str) -> dict:  # noqa: F811
    """The claims of the ID token the public client gets for C{code}."""
    data = urlencode({"grant_type": "authorization_code", "code": code, "code_verifier": verifier,
                      "redirect_uri": callback + "/first", "client_id": "web"}).encode()
    with urllib.request.urlopen(server.base + "/api/auth/oauth2/token", data, timeout=WAIT) as response:
        payload = json.load(response)["id_token"].split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_register_sign_in_refuse_a_clone_and_remove_a_passkey(server, driver, callback):  # noqa: F811
    issuer = server.base + "/api/auth"
    authenticator = virtual_authenticator(driver)

    account_signed_in(driver, issuer)
    assert "No passkeys yet." in driver.find_element(By.TAG_NAME, "main").text
    WebDriverWait(driver, WAIT).until(expected_conditions.visibility_of_element_located(
        (By.CSS_SELECTOR, "#add-passkey button")))
    driver.find_element(By.CSS_SELECTOR, "#add-passkey button").click()
    assert status_text(driver) == "Your passkey is added."
    assert "Device-bound passkey" in driver.find_element(By.TAG_NAME, "main").text
    [registered] = credentials(driver, authenticator)
    assert registered["isResidentCredential"] is True and registered["rpId"] == "localhost"

    verifier, challenge = pkce_pair()
    passkey_sign_in(driver, server, callback, "st-2", challenge)
    query = landed(driver, callback + "/first")
    assert query["state"] == "st-2"
    claims = id_token_claims(server, callback, query["code"], verifier)
    assert claims["amr"] == ["hwk", "user"] and claims["acr"] == "urn:authsrv:acr:pwd"

    verifier, challenge = pkce_pair()
    signed_out(driver, server)
    driver.get(with_challenge(server, callback, "st-mfa", challenge))
    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(lambda d: d.current_url.startswith(issuer + "/mfa?"))
    use_passkey(driver)
    claims = id_token_claims(server, callback, landed(driver, callback + "/first")["code"], verifier)
    assert claims["amr"] == ["pwd", "hwk", "mfa"] and claims["acr"] == "urn:authsrv:acr:mfa"
    [used] = credentials(driver, authenticator)
    assert used["signCount"] > registered["signCount"]

    clone = {**registered, "signCount": registered["signCount"]}
    driver.execute_cdp_cmd("WebAuthn.removeCredential",
                           {"authenticatorId": authenticator, "credentialId": registered["credentialId"]})
    driver.execute_cdp_cmd("WebAuthn.addCredential", {"authenticatorId": authenticator, "credential": clone})
    passkey_sign_in(driver, server, callback, "st-3")
    WebDriverWait(driver, WAIT).until(expected_conditions.presence_of_element_located((By.CLASS_NAME, "error")))
    assert driver.find_element(By.CLASS_NAME, "error").text == (
        "That passkey was not accepted. Try again, or sign in another way.")
    assert driver.current_url.startswith(issuer + "/login")

    driver.execute_cdp_cmd("WebAuthn.removeCredential",
                           {"authenticatorId": authenticator, "credentialId": registered["credentialId"]})
    ahead = {**used, "signCount": used["signCount"] + 10}
    driver.execute_cdp_cmd("WebAuthn.addCredential", {"authenticatorId": authenticator, "credential": ahead})
    signed_out(driver, server)
    account_signed_in(driver, issuer, second_factor=True)
    driver.find_element(By.XPATH, "//form[contains(@action, '/passkeys/remove')]/button").click()
    assert status_text(driver) == "The passkey is removed."
    assert "No passkeys yet." in driver.find_element(By.TAG_NAME, "main").text

    passkey_sign_in(driver, server, callback, "st-5")
    WebDriverWait(driver, WAIT).until(expected_conditions.presence_of_element_located((By.CLASS_NAME, "error")))
    assert driver.current_url.startswith(issuer + "/login")
    out, _ = server.stop()
    assert "passkey.refused" in out and "cloned authenticator" in out, "the clone is audited"
