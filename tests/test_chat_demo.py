"""
The chat-platform demo as a newcomer runs it: C{twist authsrv-fake-chat},
authsrv on examples/demo.toml and the example app, each a real process on a
free port; bob signs in to the app, follows its "link chat account" button
through the stand-in's approval, and chat-token then answers for him.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import pytest
import requests

from conftest import EXAMPLES, ROOT, free_port
from test_e2e_relying_party import read_form

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

ALICE = "a1f0c9e2-5b7d-4c1e-9a3f-6d2b8e4c7a10"
BOB = "b2e1d8f3-6c8e-4d2f-8b4a-7e3c9f5d8b21"
INTERNAL = {"authorization": "Bearer demo-internal-secret"}


def wait_for(url: str, process: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            requests.get(url, allow_redirects=False, timeout=1)
            return
        except requests.ConnectionError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listened at {url} in time")


@pytest.fixture
def demo(tmp_path, run_server):
    """The three processes; yields (authsrv's base URL, the app's URL)."""
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("demo-data"))
    config = tmp_path / "examples" / "demo.toml"
    port, app_port, chat_port = free_port(), free_port(), free_port()
    app = f"http://127.0.0.1:{app_port}"
    config.write_text(
        config.read_text()
        .replace("http://127.0.0.1:9000/", app + "/")
        .replace("http://127.0.0.1:9100/", f"http://127.0.0.1:{chat_port}/")
    )
    fake = run_server(["authsrv-fake-chat", "--port", str(chat_port)], tmp_path, port=chat_port, ready=False)
    authsrv = run_server(["authsrv", "--config", str(config), "--listen", f"tcp:{port}:interface=127.0.0.1",
                          "--public-url", f"http://127.0.0.1:{port}"], tmp_path, port=port)
    log = tmp_path / "rp_app.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "rp_app.py"), "--authsrv", authsrv.base,
             "--client-secret-file", "examples/demo-secrets/demo-app",
             "--internal-secret-file", "examples/demo-secrets/internal-api-secret",
             "--listen", f"tcp:{app_port}:interface=127.0.0.1", "--public-url", app, "--timeout", "5"],
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        wait_for(fake.base + "/api/users/@me", fake.process, log)
        wait_for(app + "/", process, log)
        yield authsrv.base, app
    finally:
        process.terminate()
        process.wait(timeout=10)


def chat_token(base: str, sub: str) -> requests.Response:
    return requests.post(base + "/api/internal/chat-token", json={"userId": sub}, headers=INTERNAL, timeout=10)


def test_bob_links_in_the_browser_then_chat_token_answers(demo):
    base, app = demo
    assert chat_token(base, BOB).json()["error"] == "chat_not_linked"

    browser = requests.Session()
    form_page = browser.get(app + "/", timeout=10)
    form = read_form(form_page.text)
    home = browser.post(requests.compat.urljoin(form_page.url, form.action or form_page.url),
                        data={**form.fields, "username": "bob", "password": "bob-password"}, timeout=10)
    assert home.status_code == 200 and home.url == app + "/", home.text
    [link] = re.findall(r'<a href="([^"]+)" id="link-chat">Link chat account</a>', home.text)
    assert link == base + "/api/auth/link/chat"

    start_page = browser.get(link, timeout=10)
    start = read_form(start_page.text)
    assert start_page.status_code == 200 and start.action == link, start_page.text
    linked = browser.post(link, data=start.fields, timeout=10)
    assert linked.status_code == 200, linked.text
    assert "80351110224678913" in linked.text and "is now linked" in linked.text
    assert linked.url.startswith(base + "/api/auth/link/chat/callback?")
    assert any("/oauth2/authorize?" in r.url for r in linked.history)

    answer = chat_token(base, BOB)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["accessToken"] and body["accountId"]
    assert "identify" in body["scope"]
    assert "identify" in browser.get(app + "/", timeout=10).text


def seed(config, user: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "examples" / "seed_chat_link.py"), "--config", str(config), user],
                          capture_output=True, text=True, timeout=60)


def test_alice_seeded_answers_at_once(demo, tmp_path):
    """The demo's seeding script pre-links alice: chat-token answers for her without a browser."""
    base, _ = demo
    config = tmp_path / "examples" / "demo.toml"
    assert chat_token(base, ALICE).json()["error"] == "chat_not_linked"
    seeded = seed(config, "alice")
    assert seeded.returncode == 0, seeded.stderr
    assert "linked alice" in seeded.stdout and "80351110224678912" in seeded.stdout
    answer = chat_token(base, ALICE)
    assert answer.status_code == 200, answer.text
    assert answer.json()["scope"] == "identify guilds.join"
    refused = seed(config, "nobody")
    assert refused.returncode != 0 and "nobody: no such user" in refused.stderr


def test_seeding_a_chat_account_another_user_holds_says_so_in_one_line(tmp_path):
    """One chat account names one user: seeding it for a second says so, without a traceback, and keeps the first."""
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("demo-data"))
    users = tmp_path / "examples" / "demo-users.toml"
    alices = 'chat_user_id = "80351110224678912"\n'
    users.write_text(users.read_text().replace('login = "bob"\n', 'login = "bob"\n' + alices))
    config = tmp_path / "examples" / "demo.toml"
    assert seed(config, "bob").returncode == 0
    refused = seed(config, "alice")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == ("alice: chat user 80351110224678912 is already linked to another user; unlink it there"
                              " first (account page), nothing changed\n")
    again = seed(config, "bob")
    assert again.returncode == 0 and "linked bob" in again.stdout, "bob's link is still his to replace"
