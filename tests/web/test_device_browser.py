"""
The device verification page in a real browser (headless Chromium, as in
tests/web/test_browser.py) against a real `twist authsrv`: a device (this
test, over HTTP) asks for codes and polls in a thread, getting
authorization_pending, while a person types the code, signs in, checks the
code and client and allows the device; the waiting poller then gets its
tokens.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait
from test_browser import (  # noqa: F401  (fixtures)
    PASSWORD,
    WAIT,
    _browser_installed,
    carol_server,
    driver,
    sign_in,
)

pytestmark = pytest.mark.slow

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


@pytest.fixture
def server(run_server, tmp_path):
    return carol_server(run_server, tmp_path, [
        {"client_id": "tv", "name": "Living-Room TV", "redirect_uris": ["http://127.0.0.1:9/unused"],
         "grant_types": [DEVICE_GRANT, "refresh_token"]},
    ], device={"interval": "1s"})


class Poller(threading.Thread):
    """The device: polls at the interval it was given until it gets an answer other than pending."""

    def __init__(self, token_endpoint: str, device_code: str, interval: int):
        super().__init__(daemon=True)
        self.token_endpoint, self.device_code, self.interval = token_endpoint, device_code, interval
        self.errors: list[str] = []
        self.answer: dict | None = None

    def run(self):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(self.interval)
            body = requests.post(self.token_endpoint, timeout=5, data={
                "grant_type": DEVICE_GRANT, "device_code": self.device_code, "client_id": "tv",
            }).json()
            if body.get("error") in ("authorization_pending", "slow_down"):
                self.errors.append(body["error"])
                self.interval += 5 if body["error"] == "slow_down" else 0
                continue
            self.answer = body
            return


def test_a_person_approves_a_waiting_device(server, driver):
    issuer = server.base + "/api/auth"
    metadata = requests.get(issuer + "/.well-known/openid-configuration", timeout=5).json()
    codes = requests.post(metadata["device_authorization_endpoint"], timeout=5,
                          data={"client_id": "tv", "scope": "openid profile offline_access"}).json()
    poller = Poller(metadata["token_endpoint"], codes["device_code"], codes["interval"])
    poller.start()

    driver.get(codes["verification_uri"])
    WebDriverWait(driver, WAIT).until(expected_conditions.presence_of_element_located((By.NAME, "user_code")))
    driver.find_element(By.NAME, "user_code").send_keys(codes["user_code"].replace("-", " ").lower())
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(driver, WAIT).until(lambda d: d.current_url.startswith(issuer + "/login?"))
    assert "to continue to Living-Room TV" in driver.find_element(By.TAG_NAME, "main").text
    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(expected_conditions.presence_of_element_located(
        (By.CSS_SELECTOR, "button[value=approve]")))
    page = driver.find_element(By.TAG_NAME, "main").text
    assert codes["user_code"] in page and "Living-Room TV" in page and "Your name and picture" in page
    assert poller.is_alive() and poller.answer is None
    deadline = time.monotonic() + 10
    while not poller.errors:  # the device has been told to wait before the person allows it
        assert time.monotonic() < deadline, "the device never polled"
        time.sleep(0.05)
    driver.find_element(By.CSS_SELECTOR, "button[value=approve]").click()
    # The heading read while the form's answer replaces the page goes stale, or belongs to
    # a document chromedriver has already let go of ("Node with given id does not belong
    # to the document", an unknown error): read it again.
    WebDriverWait(driver, WAIT, ignored_exceptions=(WebDriverException,)).until(
        lambda d: "Device connected" in d.find_element(By.TAG_NAME, "h1").text)

    poller.join(30)
    assert poller.answer is not None and "authorization_pending" in poller.errors
    assert poller.answer["token_type"] == "Bearer" and poller.answer["id_token"] and poller.answer["refresh_token"]
    userinfo = requests.get(metadata["userinfo_endpoint"], timeout=5,
                            headers={"Authorization": f"Bearer {poller.answer['access_token']}"}).json()
    assert userinfo["name"] == "Carol"
