"""
A sign-in begun on the client's own site, as a person meets it, in a real
browser (headless Chromium, as in tests/web/test_browser.py) against a real
`twist authsrv`: a link on the client's page, the same link opening a new
tab, a form posting the request, a browser that blocks third-party cookies,
and two tabs signing in to two clients at once. The sign-in's pages open
only in the browser that began it (its device cookie, SameSite=Lax): every
one of these is that browser, and must get through.
"""

from __future__ import annotations

from html import escape
from urllib.parse import urlencode

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from test_browser import (  # noqa: F401  (fixtures)
    CHROMEDRIVER,
    ClientPage,
    PASSWORD,
    WAIT,
    _browser_installed,
    callback,
    chromium_options,
    client_site,
    landed,
    sign_in,
)
from test_page_journeys import click, server  # noqa: F401  (fixtures)

from harness import pkce_pair

pytestmark = pytest.mark.slow


@pytest.fixture(params=[False, True], ids=["cookies", "third-party cookies blocked"])
def driver(request, tmp_path):
    options = chromium_options(tmp_path)
    if request.param:
        options.add_experimental_option("prefs", {"profile.block_third_party_cookies": True})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(WAIT)
    yield driver
    driver.quit()


def request_fields(client_id: str, redirect_uri: str, state: str) -> dict[str, str]:
    return {"response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "scope": "openid",
            "state": state, "code_challenge": pkce_pair()[1], "code_challenge_method": "S256"}


def signed_in_and_back(driver, callback, state: str) -> None:  # noqa: F811
    """Sign in on the page the browser is at, allow the partner, and land back at it with C{state}."""
    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(lambda d: "/consent?" in d.current_url, driver.title)
    click(driver, "button[value=approve]")
    assert landed(driver, callback + "/partner")["state"] == state


def test_a_link_on_the_client_site_signs_in(server, driver, callback, client_site):  # noqa: F811
    fields = request_fields("partner", callback + "/partner", "st-link")
    ClientPage.form = f'<a id="go" href="{escape(server.base)}/api/auth/oauth2/authorize?{escape(urlencode(fields))}">Sign in</a>'
    driver.get(client_site + "/")
    driver.find_element(By.ID, "go").click()
    signed_in_and_back(driver, callback, "st-link")


def test_a_link_opening_a_new_tab_signs_in_there(server, driver, callback, client_site):  # noqa: F811
    fields = request_fields("partner", callback + "/partner", "st-tab")
    ClientPage.form = (f'<a id="go" target="_blank" rel="noopener"'
                        f' href="{escape(server.base)}/api/auth/oauth2/authorize?{escape(urlencode(fields))}">Sign in</a>')
    driver.get(client_site + "/")
    driver.find_element(By.ID, "go").click()
    WebDriverWait(driver, WAIT).until(lambda d: len(d.window_handles) == 2)
    driver.switch_to.window(driver.window_handles[1])
    signed_in_and_back(driver, callback, "st-tab")


def test_a_request_posted_from_the_client_site_signs_in(server, driver, callback, client_site):  # noqa: F811
    """OIDC Core section 3.1.2.1: a POST to the authorization endpoint, which carries no Lax cookie across sites."""
    fields = request_fields("partner", callback + "/partner", "st-post")
    inputs = "".join(f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">' for k, v in fields.items())
    ClientPage.form = f'<form method="post" action="{escape(server.base)}/api/auth/oauth2/authorize">{inputs}<button id="go">Sign in</button></form>'
    driver.get(client_site + "/")
    driver.find_element(By.ID, "go").click()
    signed_in_and_back(driver, callback, "st-post")


def test_two_tabs_sign_in_to_two_clients_at_once(server, driver, callback, client_site):  # noqa: F811
    """Both tabs show their login page before either signs in; each then finishes at its own client."""
    base = f"{server.base}/api/auth/oauth2/authorize?"
    driver.get(base + urlencode(request_fields("partner", callback + "/partner", "st-one")))
    WebDriverWait(driver, WAIT).until(lambda d: d.find_elements(By.NAME, "username"))
    first = driver.current_window_handle
    driver.switch_to.new_window("tab")
    driver.get(base + urlencode(request_fields("web", callback + "/first", "st-two")))
    sign_in(driver, "carol", PASSWORD)
    assert landed(driver, callback + "/first")["state"] == "st-two"

    driver.switch_to.window(first)
    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(lambda d: "/consent?" in d.current_url, driver.title)
    click(driver, "button[value=approve]")
    assert landed(driver, callback + "/partner")["state"] == "st-one"


CALLS = """
var done = arguments[arguments.length - 1], issuer = arguments[0];
function read(response) {
  return response.text().then(function (body) {
    return {status: response.status, body: body, challenge: response.headers.get('WWW-Authenticate')};
  }, function (error) { return String(error); });
}
function failed(error) { return 'failed: ' + error; }
Promise.all([
  fetch(issuer + '/oauth2/token', {method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded',
        'DPoP': 'not.a.proof'}, body: 'grant_type=authorization_code&code=nothing;state=x'}).then(read, failed),
  fetch(issuer + '/oauth2/userinfo', {headers: {'Authorization': 'Bearer not-a-token'}}).then(read, failed),
  fetch(issuer + '/oauth2/token').then(read, failed),
  fetch(issuer + '/jwks', {method: 'HEAD'}).then(read, failed),
]).then(done, function (error) { done(String(error)); });
"""


@pytest.mark.parametrize("driver", [False], ids=["cookies"], indirect=True)
def test_a_single_page_app_on_another_site_reads_the_answers_its_calls_get(server, driver, client_site):  # noqa: F811
    """
    The calls a browser makes only after a CORS preflight (a DPoP or an
    Authorization header) reach the endpoints, and their answers, refusals
    and a 405 included, are read by the page rather than failing the fetch.
    """
    ClientPage.form = "<p>app</p>"
    driver.get(client_site + "/")
    answers = driver.execute_async_script(CALLS, server.base + "/api/auth")
    token, userinfo, get, head = answers
    assert token["status"] == 401 and '"error":"invalid_client"' in token["body"], token
    assert userinfo["status"] == 401 and userinfo["challenge"].startswith("Bearer"), userinfo
    assert get["status"] == 405 and '"error":"' in get["body"], get
    assert head == {"status": 200, "body": "", "challenge": None}
