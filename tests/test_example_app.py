"""
The example first-party app (examples/rp_app.py) as a real process against a
real authsrv, with a requests session as the user's browser: sign-in, the
protected page, a ban seen on the very next request, sign-out through
revocation and end-session, and tokens refreshed near expiry.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from http.cookies import SimpleCookie

import pytest
import pytest_twisted
import requests

from conftest import EXAMPLES, ROOT, admin, free_port
from test_e2e_relying_party import read_form

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

ALICE = "a1f0c9e2-5b7d-4c1e-9a3f-6d2b8e4c7a10"
INTERNAL = {"authorization": "Bearer demo-internal-secret"}
SECRETS = ("demo-app-secret", "demo-internal-secret")


class Stack:
    """authsrv and the example app, each on a free port, and a browser."""

    def __init__(self, tmp_path, run_server, limits: str, app_args: list[str]):
        shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("demo-data"))
        self.config = tmp_path / "examples" / "demo.toml"
        self.cwd = tmp_path
        port, app_port = free_port(), free_port()
        self.app = f"http://127.0.0.1:{app_port}"
        self.config.write_text(
            self.config.read_text().replace("http://127.0.0.1:9000/", self.app + "/")
            + f"\n[limits]\n{limits}\n"
        )
        self.authsrv = run_server(["authsrv", "--config", str(self.config),
                                   "--listen", f"tcp:{port}:interface=127.0.0.1",
                                   "--public-url", f"http://127.0.0.1:{port}"], tmp_path, port=port)
        self.issuer = self.authsrv.base + "/api/auth"
        self.log = tmp_path / "rp_app.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(ROOT / "examples" / "rp_app.py"),
                 "--authsrv", self.authsrv.base,
                 "--client-secret-file", "examples/demo-secrets/demo-app",
                 "--internal-secret-file", "examples/demo-secrets/internal-api-secret",
                 "--listen", f"tcp:{app_port}:interface=127.0.0.1",
                 "--public-url", self.app, "--timeout", "5", *app_args],
                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
            )
        self.browser = requests.Session()
        self._wait_for_app()

    def _wait_for_app(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            try:
                requests.get(self.app + "/", allow_redirects=False, timeout=1)
                return
            except requests.ConnectionError:
                time.sleep(0.1)
        raise AssertionError("the example app did not listen in time")

    def stop(self) -> str:
        """Stop the app; its log."""
        self.process.terminate()
        self.process.wait(timeout=10)
        return self.log.read_text()

    def get(self, path: str = "/") -> requests.Response:
        return self.browser.get(self.app + path, timeout=10)

    def sign_in(self, username: str, password: str) -> requests.Response:
        """From the app's page to the login form at authsrv, and back: the protected page."""
        form_page = self.get()
        assert form_page.url.startswith(self.issuer + "/"), form_page.url
        assert form_page.history and form_page.history[0].url == self.app + "/"
        form = read_form(form_page.text)
        page = self.browser.post(
            requests.compat.urljoin(form_page.url, form.action or form_page.url),
            data={**form.fields, "username": username, "password": password}, timeout=10,
        )
        assert page.status_code == 200 and page.url == self.app + "/", (page.url, page.text)
        assert any(r.url.startswith(self.app + "/callback?") for r in page.history)
        return page

    def user_access(self, sub: str) -> dict:
        answer = requests.post(self.authsrv.base + "/api/internal/user-access", json={"userId": sub},
                               headers=INTERNAL, timeout=5)
        assert answer.status_code == 200, answer.text
        return answer.json()


@pytest.fixture
def start_stack(tmp_path, run_server):
    stacks: list[Stack] = []

    def start(limits: str = "", app_args: tuple[str, ...] = ()) -> Stack:
        stacks.append(Stack(tmp_path, run_server, limits, list(app_args)))
        return stacks[-1]

    yield start
    for stack in stacks:
        if stack.process.poll() is None:
            log = stack.stop()
            assert not [s for s in SECRETS if s in log], "a secret reached the app's log"
            assert "eyJ" not in log, "a token reached the app's log"


def session_cookie(stack: Stack, response: requests.Response) -> SimpleCookie:
    """The cookies set by the app's callback on its way to C{response}."""
    callback = next(r for r in response.history if r.url.startswith(stack.app + "/callback?"))
    cookies = SimpleCookie()
    for header in callback.raw.headers.getlist("set-cookie"):
        cookies.load(header)
    return cookies


def element(page: requests.Response, id_: str) -> str:
    match = re.search(rf'id="{id_}">(.*?)<', page.text)
    assert match, page.text
    return match.group(1)


@pytest_twisted.ensureDeferred
async def test_sign_in_ban_locks_out_on_next_request_then_logout(start_stack):
    stack = start_stack()
    page = stack.sign_in("alice", "alice-password")
    assert "Hello, Alice Liddell" in page.text and element(page, "email") == "alice@demo.test"
    assert element(page, "refreshes") == "0"
    assert "chat_not_linked" in page.text
    assert "demo-app-secret" not in page.text and "eyJ" not in page.text
    cookie = session_cookie(stack, page)["rp_session"]
    assert cookie["httponly"] and cookie["samesite"].lower() == "lax" and cookie["path"] == "/"
    assert not cookie["secure"], "Secure only under an https public URL"
    assert page.headers["cache-control"] == "no-store"
    assert stack.user_access(ALICE)["hasActiveGrant"] is True

    banned = await admin("--config", str(stack.config), "ban", "alice", "--reason", "spam", cwd=stack.cwd)
    assert banned.returncode == 0, banned.stderr
    revoked = stack.get()
    assert revoked.status_code == 403 and "Your access was revoked" in revoked.text
    assert "Reason: spam" in revoked.text and 'href="/"' in revoked.text
    assert "rp_session" not in stack.browser.cookies, "the revoked session's cookie was kept"
    assert stack.user_access(ALICE)["hasActiveGrant"] is False, "the dropped session's tokens outlived it"
    again = stack.get()
    assert again.url.startswith(stack.issuer + "/"), "a banned user's session survived"

    unbanned = await admin("--config", str(stack.config), "unban", "alice", cwd=stack.cwd)
    assert unbanned.returncode == 0, unbanned.stderr
    page = stack.sign_in("alice", "alice-password")
    assert "Hello, Alice Liddell" in page.text

    form = read_form(page.text)
    assert form.action == "/logout" and form.fields["csrf"]
    for wrong in ("forged", "forg\u00e9"):
        forged = stack.browser.post(stack.app + "/logout", data={"csrf": wrong}, timeout=10)
        assert forged.status_code == 403 and "Sign-out failed" in forged.text
    out = stack.browser.post(stack.app + "/logout", data=form.fields, allow_redirects=False, timeout=10)
    assert out.status_code == 303
    end_session = out.headers["location"]
    assert end_session.startswith(stack.issuer + "/oauth2/end-session?")
    assert "id_token_hint=" in end_session and "state=" in end_session
    assert f"post_logout_redirect_uri={requests.utils.quote(stack.app + '/', safe='')}" in end_session
    assert "rp_session" not in stack.browser.cookies
    back = stack.browser.get(end_session, timeout=10)
    assert back.history[0].status_code == 302
    assert back.url.startswith(stack.app + "/?state=") and back.status_code == 200
    assert "You are signed out" in back.text
    assert stack.user_access(ALICE) == {"allowed": False, "banned": False, "banReason": None,
                                        "hasActiveGrant": False}, "logout left a grant active"
    assert stack.get().url.startswith(stack.issuer + "/"), "the browser session at authsrv outlived logout"


def test_tokens_refreshed_near_expiry_and_the_new_ones_used(start_stack):
    # Every page is within the margin of expiry, and a stale refresh token
    # used even once would revoke the whole grant (no grace window).
    stack = start_stack(limits='access_token_ttl = "1h"\nrefresh_grace = 0', app_args=("--refresh-margin", "7200"))
    seen = []
    for count in (1, 2, 3):
        page = stack.get() if seen else stack.sign_in("bob", "bob-password")
        assert page.status_code == 200 and "Hello, Bob Builder" in page.text, page.text
        assert element(page, "refreshes") == str(count)
        seen.append(element(page, "access-token"))
    assert len(set(seen)) == 3, "the refreshed access token was not the one used"


def test_bad_requests_get_pages_not_tracebacks(start_stack):
    stack = start_stack()
    for path, status in [("/callback", 400), ("/callback?state=nope&code=x", 400),
                         ("/callback?state=%ff%fe", 400), ("/nowhere", 404)]:
        answer = stack.get(path)
        assert answer.status_code == status, (path, answer.text)
        assert "<h1>" in answer.text and "Traceback" not in answer.text
    assert stack.browser.post(stack.app + "/", timeout=10).status_code == 405
    signed_out = stack.browser.post(stack.app + "/logout", data={"csrf": "x"}, timeout=10)
    assert signed_out.status_code == 200 and "You are signed out" in signed_out.text

    for stranger_cookie in ({}, {"rp_login": "\u00e9t\u00e9"}):
        started = stack.browser.get(stack.app + "/", allow_redirects=False, timeout=10)
        state = re.search(r"state=([^&]+)", started.headers["location"]).group(1)
        stranger = requests.get(f"{stack.app}/callback?state={state}&code=x", cookies=stranger_cookie, timeout=10)
        assert stranger.status_code == 400, "a callback from another browser was accepted"
        assert "not started here" in stranger.text
