"""
The login and consent pages in a real browser: Debian's chromium, headless,
driven by selenium against a real `twist authsrv` process. A user signs in
(after one wrong password), consents, and lands on the client's redirect URI
with code, state and iss; the session cookie has the flags docs/design.md asks.

Chromium and chromedriver come from Debian's chromium and chromium-driver
packages, which scripts/test.sh installs: in CI (CI=true) their absence is a
failure; elsewhere the test is skipped with a reason naming the packages.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

import pytest
import requests
from argon2 import PasswordHasher, profiles
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from conftest import free_port
from harness import pkce_pair, query_of
from prepared_keys import write_key_file

from authsrv.identity.passwords import hash_password
from authsrv.identity.static import add_user

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT = 10
PASSWORD = "a long and correct passphrase"
CHEAP = PasswordHasher.from_parameters(profiles.CHEAPEST)
CAROL_SUB = "c0ffee00-0000-4000-8000-000000000001"
LONG_NAME = "The " + "Extraordinarily" * 8 + " Application"
HOSTILE = """Evil "'><img src=x onerror="window.pwned=1"><script>window.pwned=2</script><style>*{color:red}</style>"""
"""Markup in a client's name, a login hint and state: each must show as text and run nothing."""


class _Callback(BaseHTTPRequestHandler):
    """
    The client's redirect URI: answers anything with a small page; keeps
    the body of every POST (back-channel logout) in C{posted}.
    """

    posted: list[tuple[str, bytes]] = []

    def do_POST(self):
        self.posted.append((self.path, self.rfile.read(int(self.headers["content-length"] or 0))))
        self.send_response(200)
        self.end_headers()

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.end_headers()
        self.wfile.write(b"<!DOCTYPE html><title>callback</title><p>back at the client</p>")

    def log_message(self, *args):
        pass


@pytest.fixture
def callback():
    """A local HTTP server standing in for the client; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Callback)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def server(run_server, tmp_path, callback):
    return carol_server(run_server, tmp_path, [
        {"client_id": "web", "name": "First Web", "first_party": True,
         "redirect_uris": [callback + "/first"], "end_session_enabled": True,
         "post_logout_redirect_uris": [callback + "/signed-out"], "backchannel_logout_uri": callback + "/backchannel"},
        {"client_id": "partner", "name": "Partner Site", "redirect_uris": [callback + "/partner"]},
        {"client_id": "long", "name": LONG_NAME, "redirect_uris": [callback + "/long"]},
        {"client_id": "hostile", "name": HOSTILE, "redirect_uris": [callback + "/hostile"]},
    ])


def carol_server(run_server, tmp_path, clients: list[dict], *, host: str = "127.0.0.1", **sections):
    """
    authsrv started in C{tmp_path} on a free port, at C{http://host:port}
    (listening on 127.0.0.1 whatever the name): SQLite, a JWK file, a users
    file of carol (L{PASSWORD}), C{clients}, and any other config
    C{sections}; its C{base} is that public URL.
    """
    port = free_port()
    add_user(tmp_path / "users.toml", login="carol", password_hash=hash_password(PASSWORD, CHEAP),
             sub=CAROL_SUB, name="Carol")
    config = {
        "server": {"public_url": f"http://{host}:{port}", "listen": [f"tcp:{port}:interface=127.0.0.1"]},
        "store": {"plugin": "sqlite", "path": "authsrv.sqlite3"},
        "keystore": {"plugin": "jwk-file", "path": "keys.jwks.json"},
        "identity": [{"plugin": "static", "path": "users.toml"}],
        "clients": clients,
        **sections,
    }
    (tmp_path / "authsrv.toml").write_text(_toml(config))
    write_key_file(tmp_path / "keys.jwks.json")
    started = run_server(["authsrv", "--config", str(tmp_path / "authsrv.toml")], tmp_path, port=port)
    started.base = f"http://{host}:{port}"
    return started


def _toml(config: dict) -> str:
    """
    The little TOML this test needs: tables and arrays of tables whose values
    are strings, booleans and lists of strings, which JSON writes as TOML does.
    """
    lines = []
    for name, section in config.items():
        for table in section if isinstance(section, list) else [section]:
            lines.append(f"[[{name}]]" if isinstance(section, list) else f"[{name}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def require_browser(chromium: Path = CHROMIUM, chromedriver: Path = CHROMEDRIVER) -> None:
    """Fail in CI, else skip, when the browser or its driver is missing."""
    missing = [str(path) for path in (chromium, chromedriver) if not path.exists()]
    if missing:
        message = (f"{' and '.join(missing)} not found: install Debian's chromium and chromium-driver packages"
                   " (scripts/test.sh does)")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(autouse=True)
def _browser_installed(request):
    """Before any server starts, for the tests that drive the browser."""
    if "driver" in request.fixturenames:
        require_browser()


def chromium_options(tmp_path) -> webdriver.ChromeOptions:
    """Headless Chromium with a profile of its own under C{tmp_path}, quiet on the network."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(argument)
    return options


@pytest.fixture
def driver(tmp_path):
    driver = webdriver.Chrome(options=chromium_options(tmp_path), service=Service(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(WAIT)
    yield driver
    driver.quit()


def authorize_url(server, client_id: str, redirect_uri: str, state: str) -> str:
    return f"{server.base}/api/auth/oauth2/authorize?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri,
        "scope": "openid profile offline_access", "state": state, "code_challenge": pkce_pair()[1],
        "code_challenge_method": "S256",
    })


def sign_in(driver, username: str, password: str) -> None:
    WebDriverWait(driver, WAIT).until(expected_conditions.presence_of_element_located((By.NAME, "username")))
    field = driver.find_element(By.NAME, "username")
    field.clear()
    field.send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def landed(driver, url: str) -> dict[str, str]:
    WebDriverWait(driver, WAIT).until(lambda d: d.current_url.startswith(url + "?"))
    return query_of(driver.current_url)


def test_a_person_signs_in_consents_and_lands_back_at_the_client(server, driver, callback):
    issuer = server.base + "/api/auth"
    driver.get(authorize_url(server, "partner", callback + "/partner", "st-1"))
    assert "to continue to Partner Site" in driver.find_element(By.TAG_NAME, "main").text

    sign_in(driver, "carol", "not the password")
    WebDriverWait(driver, WAIT).until(expected_conditions.presence_of_element_located((By.CLASS_NAME, "error")))
    assert driver.find_element(By.CLASS_NAME, "error").text == "The username or password is incorrect."
    assert driver.current_url.startswith(issuer + "/login")

    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(lambda d: d.current_url.startswith(issuer + "/consent?"))
    page = driver.find_element(By.TAG_NAME, "main").text
    assert "Partner Site" in page and "Your name and picture" in page
    driver.find_element(By.CSS_SELECTOR, "button[value=approve]").click()
    query = landed(driver, callback + "/partner")
    assert query["state"] == "st-1" and query["iss"] == issuer and len(query["code"]) >= 43

    driver.get(authorize_url(server, "web", callback + "/first", "st-2"))
    query = landed(driver, callback + "/first")
    assert query["state"] == "st-2" and query["code"], "the live session skips the login"

    driver.get(issuer + "/login")
    cookies = {c["name"]: c for c in driver.get_cookies()}
    for name in ("authsrv_session", "authsrv_device"):
        assert cookies[name]["httpOnly"] is True
        assert cookies[name]["sameSite"] == "Lax"
        assert cookies[name]["path"] == "/api/auth"
        assert cookies[name]["secure"] is False


def test_a_long_client_name_wraps_within_the_page(server, driver, callback):
    driver.get(authorize_url(server, "long", callback + "/long", "st-3"))
    assert LONG_NAME in driver.find_element(By.TAG_NAME, "main").text
    assert_fits(driver)
    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(lambda d: "/consent?" in d.current_url)
    assert_fits(driver)


def test_markup_from_a_client_name_or_a_request_runs_nothing(server, driver, callback):
    """Shown as text on the sign-in and consent pages; the page's content security policy allows none of it either."""
    url = authorize_url(server, "hostile", callback + "/hostile", HOSTILE)
    driver.get(f"{url}&{urlencode({'login_hint': HOSTILE})}")
    assert_inert(driver)
    sign_in(driver, "carol", PASSWORD)
    WebDriverWait(driver, WAIT).until(lambda d: "/consent?" in d.current_url)
    assert_inert(driver)


def assert_inert(driver) -> None:
    assert HOSTILE in driver.find_element(By.TAG_NAME, "main").text
    assert driver.execute_script("return [window.pwned, document.querySelectorAll('img[src=x], main style').length,"
                                 " [...document.scripts].filter(s => s.text.includes('pwned')).length]") == [None, 0, 0]


def assert_fits(driver) -> None:
    """Nothing on the page is wider than its column: a long name wraps instead."""
    widths = driver.execute_script("var m = document.querySelector('main'); return [m.scrollWidth, m.clientWidth]")
    assert widths[0] <= widths[1], widths


def test_a_double_click_on_sign_in_signs_in_once(server, driver, callback):
    """The answer is slow to come back (a far network), so the second click lands on the page still shown."""
    driver.get(authorize_url(server, "partner", callback + "/partner", "st-4"))
    WebDriverWait(driver, WAIT).until(expected_conditions.presence_of_element_located((By.NAME, "username")))
    driver.find_element(By.NAME, "username").send_keys("carol")
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.set_network_conditions(offline=False, latency=300, download_throughput=10**7, upload_throughput=10**7)
    driver.execute_script("var b = document.querySelector('button[type=submit]');"
                          " b.click(); setTimeout(function () { b.click(); }, 100);")
    WebDriverWait(driver, WAIT).until(lambda d: d.title != "Sign in")
    assert driver.title == "Allow Partner Site?", driver.find_element(By.TAG_NAME, "main").text


class ClientPage(BaseHTTPRequestHandler):
    """The client's own page: C{form} is its body (a sign-out button posting to the end-session endpoint, say)."""

    form = ""

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.end_headers()
        self.wfile.write(f"<!DOCTYPE html><title>client</title>{self.form}".encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def client_site():
    """
    The client's site on another host name (localhost, where the service is
    127.0.0.1): another site to the browser, whose SameSite=Lax cookies of
    the service stay away from a form it posts there.
    """
    server = ThreadingHTTPServer(("127.0.0.1", 0), ClientPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_sign_out_form_posted_from_the_client_site_ends_the_session(server, driver, callback, client_site):
    """
    OIDC RP-Initiated Logout 1.0 section 2: the endpoint takes POST as well
    as GET. Posted from the client's site, the request reaches the service
    without the session cookie (SameSite=Lax); the session still ends at the
    service, so the clients it signed in to hear by back-channel logout, and
    the user is back at the client with its state.
    """
    issuer = server.base + "/api/auth"
    verifier, challenge = pkce_pair()
    driver.get(f"{issuer}/oauth2/authorize?" + urlencode({
        "response_type": "code", "client_id": "web", "redirect_uri": callback + "/first", "scope": "openid",
        "state": "st-5", "code_challenge": challenge, "code_challenge_method": "S256",
    }))
    sign_in(driver, "carol", PASSWORD)
    code = landed(driver, callback + "/first")["code"]
    tokens = requests.post(issuer + "/oauth2/token", timeout=WAIT, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": callback + "/first", "client_id": "web",
        "code_verifier": verifier,
    }).json()

    ClientPage.form = (
        f'<form method="post" action="{issuer}/oauth2/end-session">'
        f'<input type="hidden" name="id_token_hint" value="{tokens["id_token"]}">'
        f'<input type="hidden" name="post_logout_redirect_uri" value="{callback}/signed-out">'
        '<input type="hidden" name="state" value="st-6"><button id="sign-out">Sign out</button></form>'
    )
    _Callback.posted.clear()
    driver.get(client_site + "/")
    driver.find_element(By.ID, "sign-out").click()
    assert landed(driver, callback + "/signed-out") == {"state": "st-6"}
    WebDriverWait(driver, WAIT).until(lambda d: _Callback.posted, "no back-channel logout: the session lives on")
    [(path, body)] = _Callback.posted
    assert path == "/backchannel" and body.startswith(b"logout_token=")

    driver.get(authorize_url(server, "web", callback + "/first", "st-7"))
    WebDriverWait(driver, WAIT).until(lambda d: d.title == "Sign in" or d.current_url.startswith(callback))
    assert driver.title == "Sign in", f"still signed in: {driver.current_url}"


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), (None, pytest.skip.Exception)])
def test_a_missing_browser_fails_in_ci_and_is_skipped_elsewhere(tmp_path, monkeypatch, ci, outcome):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    chromium, chromedriver = tmp_path / "chromium", tmp_path / "chromedriver"
    chromium.touch()
    with pytest.raises(outcome, match=f"^{chromedriver} not found: install Debian's chromium and chromium-driver"):
        require_browser(chromium, chromedriver)
    chromedriver.touch()
    assert require_browser(chromium, chromedriver) is None
