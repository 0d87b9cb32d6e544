"""
openid-client from npm, unmodified, runs the device authorization grant
(RFC 8628) with node against a real `twist authsrv`: it discovers the
endpoints, starts a device authorization and polls, while a person (this
test, over HTTP as a browser would) signs in at the verification page and
allows or denies the device. Node and npm must be present in CI; elsewhere
the test is skipped without them. The library comes from tests/node's lock
file (`npm ci`, run once).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import requests

from test_browser import CAROL_SUB, PASSWORD, carol_server

pytestmark = pytest.mark.slow

NODE_DIR = Path(__file__).parent.parent / "node"
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
_HIDDEN = re.compile(r'<input type="hidden" name="(\w+)" value="([^"]*)"')


def node_tools() -> tuple[str, str]:
    """node and npm, or a failure in CI and a skip elsewhere."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        message = "node and npm are needed to run openid-client from npm"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return node, npm


@pytest.fixture(scope="module")
def node():
    node, npm = node_tools()
    with open(NODE_DIR / "node_modules.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test workers never install at once
        if not (NODE_DIR / "node_modules" / "openid-client").is_dir():
            subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR, check=True,
                           timeout=300)
    return node


@pytest.fixture
def server(run_server, tmp_path):
    return carol_server(run_server, tmp_path, [
        {"client_id": "cli", "name": "Command-Line Tool", "redirect_uris": ["http://127.0.0.1:9/x"],
         "grant_types": [DEVICE_GRANT, "refresh_token"]},
    ], device={"interval": "1s"})


def answer(server, started: dict, action: str) -> None:
    """The person: the code's page, the sign-in it asks for, then allow or deny."""
    browser = requests.Session()
    page = browser.get(started["verification_uri_complete"], timeout=5)
    assert "/login?" in page.url
    fields = dict(_HIDDEN.findall(page.text))
    page = browser.post(server.base + "/api/auth/login", timeout=5,
                        data={**fields, "username": "carol", "password": PASSWORD})
    assert page.url == started["verification_uri_complete"] and started["user_code"] in page.text
    done = browser.post(server.base + "/api/auth/device", timeout=5,
                        data={**dict(_HIDDEN.findall(page.text)), "action": action})
    assert done.status_code == 200


@pytest.mark.parametrize(("action", "expected"), [
    ("approve", {"sub": CAROL_SUB, "scope": "offline_access openid profile", "token_type": "bearer", "refresh": True}),
    ("deny", {"error": "access_denied"}),
])
def test_openid_client_runs_the_device_flow(server, node, action, expected):
    process = subprocess.Popen(
        [node, str(NODE_DIR / "device_flow.mjs"), server.base + "/api/auth", "cli", "openid profile offline_access"],
        cwd=NODE_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        started = json.loads(process.stdout.readline())
        assert started["verification_uri"] == server.base + "/api/auth/device", process.stderr.read()
        answer(server, started, action)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert json.loads(out.strip().splitlines()[-1]) == expected, err


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), (None, pytest.skip.Exception)])
def test_missing_node_fails_in_ci_and_is_skipped_elsewhere(monkeypatch, ci, outcome):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(outcome, match="^node and npm are needed"):
        node_tools()
