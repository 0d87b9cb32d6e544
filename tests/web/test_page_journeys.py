"""
The pages as a person uses them, in a real browser (headless Chromium, as in
tests/web/test_browser.py) against a real `twist authsrv`: the back button
to a form already sent, a cookie gone before a form is sent, a reload after
the account page's form (Post/Redirect/Get), the pages with
JavaScript off (docs/design.md, Browser pages), and every page with a
language, a title, a label for each field and nothing in the browser's
console: no style or script of its own blocked by its Content-Security-Policy.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import urlencode

import pyotp
import pytest
import requests
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from test_browser import (  # noqa: F401,F811  (fixtures)
    CHROMEDRIVER,
    PASSWORD,
    WAIT,
    _browser_installed,
    authorize_url,
    callback,
    carol_server,
    chromium_options,
    landed,
    sign_in,
)

from harness import pkce_pair, query_of

pytestmark = pytest.mark.slow

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"

AUDIT = """
var unlabelled = [];
document.querySelectorAll('input:not([type=hidden]):not([hidden]), select, textarea').forEach(function (field) {
  if (!(field.id && document.querySelector('label[for="' + field.id + '"]')) && !field.closest('label')) {
    unlabelled.push(field.name);
  }
});
return {lang: document.documentElement.lang, title: document.title, unlabelled: unlabelled,
        elsewhere: Array.from(document.querySelectorAll('[src], [href], form[action]')).map(function (e) {
          return new URL(e.getAttribute('src') || e.getAttribute('href') || e.getAttribute('action'), location.href);
        }).filter(function (u) { return u.protocol !== 'data:' && u.origin !== location.origin; }).map(String)};
"""


@pytest.fixture
def server(run_server, tmp_path, callback):  # noqa: F811
    return carol_server(run_server, tmp_path, [
        {"client_id": "web", "name": "First Web", "first_party": True, "redirect_uris": [callback + "/first"],
         "end_session_enabled": True, "post_logout_redirect_uris": [callback + "/signed-out"]},
        {"client_id": "partner", "name": "Partner Site", "redirect_uris": [callback + "/partner"]},
        {"client_id": "tv", "name": "Living-Room TV", "redirect_uris": ["http://127.0.0.1:9/unused"],
         "grant_types": [DEVICE_GRANT]},
    ], mfa={"required": "optional"})


def chromium(tmp_path, script: bool, page_load_strategy: str = "normal"):
    """Chromium keeping its console, with JavaScript on or off."""
    options = chromium_options(tmp_path)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.page_load_strategy = page_load_strategy
    if not script:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(WAIT)
    return driver


@pytest.fixture(params=[True, False], ids=["script", "no script"])
def driver(request, tmp_path):
    """L{chromium}, with JavaScript on or, for C{no script}, off."""
    driver = chromium(tmp_path, request.param)
    yield driver
    driver.quit()


@pytest.fixture(params=[True, False], ids=["script", "no script"])
def unwaiting_driver(request, tmp_path):
    """
    L{driver}, except that a command never waits for a page to load: a
    click may be followed by another while the page it asked for is on its way.
    """
    driver = chromium(tmp_path, request.param, "none")
    yield driver
    driver.quit()


def settled(driver) -> None:
    WebDriverWait(driver, WAIT).until(lambda d: d.execute_script("return document.readyState") == "complete")


def main_text(driver) -> str:
    return driver.find_element(By.TAG_NAME, "main").text


def gone(element) -> bool:
    """
    Whether ``element`` left the document. Chromedriver reports a node of a
    page being replaced either as stale or, caught mid-navigation, as one that
    "does not belong to the document": both mean the answer's page arrived.
    """
    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as error:
        if "does not belong to the document" in (error.msg or ""):
            return True
        raise
    return False


def click(driver, selector: str) -> None:
    """Click a form's button and wait for the page its answer brings."""
    button = driver.find_element(By.CSS_SELECTOR, selector)
    button.click()
    WebDriverWait(driver, WAIT).until(lambda _: gone(button))
    settled(driver)


def answered_sign_in(driver, username: str, password: str) -> None:
    """Sign in and wait for the page the answer brings, not the form still showing."""
    WebDriverWait(driver, WAIT).until(lambda d: d.find_elements(By.CSS_SELECTOR, "button[type=submit]"))
    button = driver.find_element(By.CSS_SELECTOR, "button[type=submit]")
    sign_in(driver, username, password)
    WebDriverWait(driver, WAIT).until(lambda _: gone(button))
    settled(driver)


def assert_well_made(driver, status: int = 200) -> None:
    """
    The page has a language, a title, a label for every field and nothing
    from elsewhere; the console has nothing but the answer's own status.
    """
    found = driver.execute_script(AUDIT)
    assert found["lang"] == "en" and found["title"], found
    assert found["unlabelled"] == [] and found["elsewhere"] == [], found
    console = [entry["message"] for entry in driver.get_log("browser")
               if "favicon.ico" not in entry["message"]
               and not (status >= 400 and f"status of {status}" in entry["message"])]
    assert console == [], console


def test_every_page_is_well_made(server, driver, callback):  # noqa: F811
    issuer = server.base + "/api/auth"
    driver.get(authorize_url(server, "partner", callback + "/partner", "st-1"))
    assert_well_made(driver)
    answered_sign_in(driver, "carol", "not the password")
    assert_well_made(driver, 401)
    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(lambda d: "/consent?" in d.current_url)
    assert_well_made(driver)
    for page in ("/account", "/account/mfa/totp", "/device"):
        driver.get(issuer + page)
        assert_well_made(driver)
    codes = requests.post(issuer + "/oauth2/device-authorization", timeout=WAIT,
                          data={"client_id": "tv", "scope": "openid"}).json()
    driver.get(codes["verification_uri_complete"])
    assert "Allow Living-Room TV on your device?" == driver.title
    assert_well_made(driver)
    driver.get(issuer + "/oauth2/authorize?client_id=unknown")
    assert_well_made(driver, 400)


def test_allow_again_after_the_back_button_sends_no_second_code(server, driver, callback):  # noqa: F811
    """
    Allow sent again from the page the back button shows: before the client
    used its code, the same answer again (as for a double click); after,
    the page says the sign-in finished.
    """
    issuer = server.base + "/api/auth"
    verifier, challenge = pkce_pair()
    driver.get(f"{issuer}/oauth2/authorize?" + urlencode({
        "response_type": "code", "client_id": "partner", "redirect_uri": callback + "/partner", "scope": "openid",
        "state": "st-2", "code_challenge": challenge, "code_challenge_method": "S256"}))
    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(lambda d: "/consent?" in d.current_url)
    click(driver, "button[value=approve]")
    answer = landed(driver, callback + "/partner")
    assert answer["state"] == "st-2"
    driver.back()
    settled(driver)
    click(driver, "button[value=approve]")
    assert landed(driver, callback + "/partner") == answer, "the same code, no second one"
    tokens = requests.post(issuer + "/oauth2/token", timeout=WAIT, data={
        "grant_type": "authorization_code", "code": answer["code"], "redirect_uri": callback + "/partner",
        "client_id": "partner", "code_verifier": verifier})
    assert tokens.status_code == 200, tokens.text
    driver.back()
    settled(driver)
    click(driver, "button[value=approve]")
    assert driver.title == "Sign-in ended"
    assert "already finished" in main_text(driver)


def test_a_form_sent_without_its_cookie_says_to_start_again(server, driver, callback):  # noqa: F811
    issuer = server.base + "/api/auth"
    driver.get(authorize_url(server, "partner", callback + "/partner", "st-3"))
    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(lambda d: "/consent?" in d.current_url)
    driver.delete_all_cookies()
    click(driver, "button[value=approve]")
    assert (driver.title, main_text(driver).splitlines()[-1]) == (
        "Signed out", "You are no longer signed in; start again from the application.")

    driver.get(authorize_url(server, "partner", callback + "/partner", "st-4"))
    settled(driver)
    driver.delete_all_cookies()
    answered_sign_in(driver, "carol", PASSWORD)
    assert driver.title == "Sign-in cannot continue" and "start again from the application" in main_text(driver)

    driver.get(issuer + "/account")
    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(lambda d: d.title == "Your account")
    driver.delete_all_cookies()
    driver.find_element(By.ID, "current_password").send_keys(PASSWORD)
    for field in ("new_password", "new_password_again"):
        driver.find_element(By.ID, field).send_keys("another long passphrase")
    click(driver, "form[action$='/password'] button")
    assert driver.title == "Not signed in" and "Open your account page to sign in" in main_text(driver)


def test_reloading_the_account_page_after_a_password_change_sends_nothing_again(server, driver):  # noqa: F811
    """Post/Redirect/Get: the browser is left at the account page's own address, which a reload opens again."""
    issuer = server.base + "/api/auth"
    driver.get(issuer + "/account")
    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(lambda d: d.title == "Your account")
    driver.find_element(By.ID, "current_password").send_keys(PASSWORD)
    for field in ("new_password", "new_password_again"):
        driver.find_element(By.ID, field).send_keys("another long passphrase")
    click(driver, "form[action$='/password'] button")
    assert driver.current_url == issuer + "/account?done=password-changed"
    for _ in range(2):
        notice = driver.find_element(By.CSS_SELECTOR, "p.notice[role=status]")
        assert notice.text == "Your password is changed; your other sessions are signed out."
        assert_well_made(driver)
        driver.refresh()
        settled(driver)
    assert driver.current_url == issuer + "/account?done=password-changed"


def test_a_sign_out_the_application_did_not_name_is_confirmed(server, driver, callback):  # noqa: F811
    """
    The hint names a session this browser no longer has: the page asks, and
    its form signs out and goes back to the application, script or not.
    """
    issuer = server.base + "/api/auth"
    verifier, challenge = pkce_pair()
    driver.get(f"{issuer}/oauth2/authorize?" + urlencode({
        "response_type": "code", "client_id": "web", "redirect_uri": callback + "/first", "scope": "openid",
        "state": "st-5", "code_challenge": challenge, "code_challenge_method": "S256"}))
    sign_in(driver, "carol", PASSWORD)
    code = landed(driver, callback + "/first")["code"]
    tokens = requests.post(issuer + "/oauth2/token", timeout=WAIT, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": callback + "/first", "client_id": "web",
        "code_verifier": verifier}).json()
    driver.get(issuer + "/login")
    driver.delete_all_cookies()
    driver.get(authorize_url(server, "web", callback + "/first", "st-6"))
    sign_in(driver, "carol", PASSWORD)
    landed(driver, callback + "/first")
    driver.get_log("browser")  # the bare login page's 400 above

    driver.get(f"{issuer}/oauth2/end-session?" + urlencode({
        "id_token_hint": tokens["id_token"], "post_logout_redirect_uri": callback + "/signed-out", "state": "st-7"}))
    assert driver.title == "Sign out?"
    assert_well_made(driver)
    click(driver, "button[type=submit]")
    assert landed(driver, callback + "/signed-out") == {"state": "st-7"}
    driver.get(authorize_url(server, "web", callback + "/first", "st-8"))
    settled(driver)
    assert driver.title == "Sign in"


def fill(driver, **fields: str) -> None:
    """Set the fields' values as a paste would, even ones no keyboard types (a NUL)."""
    driver.execute_script("for (var name in arguments[0]) {"
                          " document.getElementsByName(name)[0].value = arguments[0][name]; }", fields)


def test_a_password_no_one_can_have_keeps_the_form_saying_what_is_wrong(server, driver, callback):  # noqa: F811
    """
    A NUL or an overlong field on the sign-in form or the password change:
    the same form again (400) saying what is wrong, never the page of a
    form expired, which sent the person back to the application.
    """
    issuer = server.base + "/api/auth"
    driver.get(authorize_url(server, "partner", callback + "/partner", "st-10"))
    settled(driver)
    for username, password, says in (
            ("carol", "pass\x00word", "The password holds a NUL character, which no password can"),
            ("c" * 9000, "guess", "The username is longer than any username can be (8 KiB)")):
        fill(driver, username=username, password=password)
        click(driver, "button[type=submit]")
        assert (driver.title, driver.find_element(By.CSS_SELECTOR, "p.error").text.split(";")[0]) == (
            "Sign in", says)
        assert_well_made(driver, 400)
    answered_sign_in(driver, "carol", PASSWORD)
    assert driver.title == "Allow Partner Site?"
    driver.get(issuer + "/account")
    settled(driver)
    fill(driver, current_password="pass\x00word", new_password="another long passphrase",
         new_password_again="another long passphrase")
    click(driver, "form[action$='/password'] button")
    assert driver.title == "Your account"
    assert driver.find_element(By.CSS_SELECTOR, "p.error").text.startswith(
        "The current password holds a NUL character, which no password can")
    assert_well_made(driver, 400)


def shown_codes(driver) -> list[str]:
    return [code.text for code in driver.find_elements(By.CSS_SELECTOR, "main li code")]


def test_reloading_new_recovery_codes_shows_them_once_and_makes_no_other_set(server, driver):  # noqa: F811
    """
    Post/Redirect/Get: the form's answer leads to the codes at their own
    address, whose reload says they were shown rather than making a set
    that silently replaces the one just written down; its button makes one.
    """
    issuer = server.base + "/api/auth"
    driver.get(issuer + "/account/mfa/totp")
    answered_sign_in(driver, "carol", PASSWORD)
    assert driver.title == "Set up two-step sign-in"
    secret = driver.find_element(By.CSS_SELECTOR, "main > p > code").text
    first = shown_codes(driver)
    driver.find_element(By.ID, "code").send_keys(pyotp.TOTP(secret).now())
    click(driver, "button[value=confirm]")
    driver.get(issuer + "/account/mfa/totp")
    answered_sign_in(driver, "carol", PASSWORD)
    driver.find_element(By.ID, "code").send_keys(first[0])
    click(driver, "button.primary")
    click(driver, "form[action$='/recovery'] button")
    assert (driver.current_url, driver.title) == (issuer + "/account/mfa/recovery", "New recovery codes")
    shown = shown_codes(driver)
    assert len(shown) == 10 and not set(shown) & set(first)
    assert_well_made(driver)
    driver.refresh()
    settled(driver)
    assert (driver.title, shown_codes(driver)) == ("Recovery codes shown already", [])
    assert_well_made(driver)
    click(driver, "form[action$='/recovery'] button")
    again = shown_codes(driver)
    assert driver.title == "New recovery codes" and len(again) == 10 and not set(again) & set(shown)


def press(driver, x: float, y: float) -> None:
    """A mouse click at (x, y) of the page shown, sent without waiting for a page the last click asked for."""
    for kind in ("mousePressed", "mouseReleased"):
        driver.execute_cdp_cmd("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left",
                                                            "clickCount": 1})


@pytest.fixture
def held_client():
    """
    A client's redirect URI that answers only once C{release} is set: a
    slow client, while whose answer the browser still shows the page it left.
    C{arrived} holds the path of each request, in order.
    """
    arrived: list[str] = []
    release = threading.Event()

    class Held(BaseHTTPRequestHandler):
        def do_GET(self):
            arrived.append(self.path)
            release.wait(WAIT)
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(b"<!DOCTYPE html><title>callback</title><p>back at the client</p>")

        def log_message(self, *args):
            pass

    held = ThreadingHTTPServer(("127.0.0.1", 0), Held)
    threading.Thread(target=held.serve_forever, daemon=True).start()
    yield SimpleNamespace(base=f"http://127.0.0.1:{held.server_address[1]}", arrived=arrived, release=release)
    release.set()
    held.shutdown()
    held.server_close()


def test_allow_sent_twice_lands_at_the_client_with_one_usable_code(run_server, tmp_path, unwaiting_driver,
                                                                    held_client):
    """
    Allow clicked again while the client is slow to answer the first click's
    redirect: without JavaScript the browser sends the form again and shows
    only that answer, which was the "Sign-in ended" page while the first
    answer's code was lost. The second answer is the first one's redirect,
    with the same code, which the client redeems once.
    """
    redirect_uri = held_client.base + "/cb"
    server = carol_server(run_server, tmp_path, [
        {"client_id": "slow", "name": "Slow Site", "redirect_uris": [redirect_uri]}])
    issuer = server.base + "/api/auth"
    verifier, challenge = pkce_pair()
    driver = unwaiting_driver
    driver.get(f"{issuer}/oauth2/authorize?" + urlencode({
        "response_type": "code", "client_id": "slow", "redirect_uri": redirect_uri, "scope": "openid",
        "state": "st-9", "code_challenge": challenge, "code_challenge_method": "S256"}))
    answered_sign_in(driver, "carol", PASSWORD)
    assert driver.title == "Allow Slow Site?"
    box = driver.execute_script("var r = document.querySelector('button[value=approve]').getBoundingClientRect();"
                                " return [r.x + r.width / 2, r.y + r.height / 2]")
    press(driver, *box)
    WebDriverWait(driver, WAIT).until(lambda _: held_client.arrived)
    press(driver, *box)
    held_client.release.set()
    code = landed(driver, redirect_uri)["code"]
    assert {query_of(path)["code"] for path in held_client.arrived if path.startswith("/cb?")} == {code}
    tokens = requests.post(issuer + "/oauth2/token", timeout=WAIT, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri, "client_id": "slow",
        "code_verifier": verifier})
    assert tokens.status_code == 200, tokens.text
