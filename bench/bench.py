"""
Throughput of authsrv's hot endpoints, as docs/design.md's speed targets measure
them: the server pinned to one core with taskset, wrk on the other core at
concurrency 16, everything on 127.0.0.1, bounded in time.

    .venv/bin/python bench/bench.py [--duration SECONDS] [--connections N]

Needs Debian's wrk. It starts its own server on the demo config (in a
temporary folder, on a free port), obtains real tokens through the login
form, and prints one Markdown table row per endpoint.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import requests

ROOT = Path(__file__).resolve().parent.parent
DEMO_APP = ("demo-app", "demo-app-secret")
GATEWAY = ("api-gateway", "api-gateway-secret")
REDIRECT_URI = "http://127.0.0.1:9000/callback"
INTERNAL_SECRET = "demo-internal-secret"


class _Form(HTMLParser):
    def __init__(self):
        super().__init__()
        self.action, self.fields = None, {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form" and self.action is None:
            self.action = attrs.get("action", "")
        elif tag == "input" and attrs.get("type") == "hidden":
            self.fields[attrs["name"]] = attrs.get("value", "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _basic(client: tuple[str, str]) -> str:
    return "Basic " + base64.b64encode(f"{client[0]}:{client[1]}".encode()).decode()


def start_server(folder: Path) -> tuple[subprocess.Popen, str]:
    shutil.copytree(ROOT / "examples", folder / "examples", ignore=shutil.ignore_patterns("demo-data"))
    port = _free_port()
    config = folder / "examples" / "demo.toml"
    config.write_text(
        config.read_text()
        .replace("http://127.0.0.1:8080", f"http://127.0.0.1:{port}")
        .replace("tcp:8080:", f"tcp:{port}:")
        # Rates no run reaches, so every request pays for the check and none is refused.
        + '\n[rate_limits]\ndefault = "1000000/s"\ninternal = "1000000/s"\n'
    )
    server = subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, "-m", "twisted", "--log-file", str(folder / "server.log"),
         "authsrv", "--config", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if requests.get(base + "/readyz", timeout=1).status_code == 200:
                return server, base
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    server.kill()
    raise SystemExit("bench: the server did not become ready:\n" + server.stderr.read().decode())


def code_flow(browser: requests.Session, base: str, scope: str, resource: str | None = None) -> dict:
    """One authorization code flow as demo-app, through the login form when needed."""
    verifier = secrets.token_urlsafe(32)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    params = {"response_type": "code", "client_id": DEMO_APP[0], "redirect_uri": REDIRECT_URI, "scope": scope,
              "state": "bench", "code_challenge": challenge, "code_challenge_method": "S256"}
    if resource:
        params["resource"] = resource
    answer = browser.get(base + "/api/auth/oauth2/authorize", params=params, allow_redirects=False)
    while answer.status_code in (302, 303) and not answer.headers["location"].startswith(REDIRECT_URI):
        answer = browser.get(urljoin(answer.url, answer.headers["location"]), allow_redirects=False)
    if answer.status_code == 200:
        form = _Form()
        form.feed(answer.text)
        answer = browser.post(urljoin(answer.url, form.action or answer.url),
                              data={**form.fields, "username": "alice", "password": "alice-password"},
                              allow_redirects=False)
    code = parse_qs(urlsplit(answer.headers["location"]).query)["code"][0]
    tokens = requests.post(base + "/api/auth/oauth2/token", auth=DEMO_APP, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT_URI, "code_verifier": verifier})
    tokens.raise_for_status()
    return tokens.json()


def fresh_codes(browser: requests.Session, base: str, count: int) -> tuple[list[str], str]:
    """
    C{count} authorization codes from the signed-in browser session (no login
    page needed), all with one PKCE pair, and that pair's verifier.
    """
    verifier = secrets.token_urlsafe(32)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    params = {"response_type": "code", "client_id": DEMO_APP[0], "redirect_uri": REDIRECT_URI,
              "scope": "openid profile email", "state": "bench", "code_challenge": challenge,
              "code_challenge_method": "S256"}
    codes = []
    for _ in range(count):
        answer = browser.get(base + "/api/auth/oauth2/authorize", params=params, allow_redirects=False)
        codes.append(parse_qs(urlsplit(answer.headers["location"]).query)["code"][0])
    return codes, verifier


def code_script(codes: list[str], verifier: str) -> str:
    """Each request redeems the next unused code."""
    pool = ", ".join(json.dumps(c) for c in codes)
    return f"""
local pool = {{{pool}}}
local verifier = {json.dumps(verifier)}
local redirect = {json.dumps(REDIRECT_URI)}
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
wrk.headers["Authorization"] = {json.dumps(_basic(DEMO_APP))}
request = function()
  local code = table.remove(pool)
  return wrk.format(nil, nil, nil, "grant_type=authorization_code&code=" .. code
    .. "&redirect_uri=" .. redirect .. "&code_verifier=" .. verifier)
end
"""


def wrk(url: str, script: str | None, duration: int, connections: int, folder: Path) -> tuple[float, str, str]:
    command = ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", url]
    if script:
        path = folder / f"script-{abs(hash(script))}.lua"
        path.write_text(script)
        command[5:5] = ["-s", str(path)]
    run = subprocess.run(command, capture_output=True, text=True)
    output = run.stdout
    if run.returncode:
        raise SystemExit(f"bench: wrk failed on {url}:\n{output}{run.stderr}")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))
    p50 = re.search(r"^\s+50%\s+(\S+)", output, re.M).group(1)
    p99 = re.search(r"^\s+99%\s+(\S+)", output, re.M).group(1)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    if errors:
        raise SystemExit(f"bench: {url} answered {errors.group(1)} errors:\n{output}")
    return rate, p50, p99


def post_script(body: str, headers: dict[str, str]) -> str:
    lines = ['wrk.method = "POST"', f"wrk.body = {json.dumps(body)}"]
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    return "\n".join(lines) + "\n"


def refresh_script(refresh_tokens: list[str]) -> str:
    """Each response's new refresh token goes back in the pool, so every request rotates a live token."""
    pool = ", ".join(json.dumps(t) for t in refresh_tokens)
    return f"""
local pool = {{{pool}}}
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
wrk.headers["Authorization"] = {json.dumps(_basic(DEMO_APP))}
request = function()
  local token = table.remove(pool)
  return wrk.format(nil, nil, nil, "grant_type=refresh_token&refresh_token=" .. token)
end
response = function(status, headers, body)
  local token = string.match(body, '"refresh_token":%s*"([^"]+)"')
  if token then table.insert(pool, token) end
end
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per endpoint (default 10)")
    parser.add_argument("--connections", type=int, default=16, help="concurrent connections (default 16)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("bench: needs wrk (apt-get install wrk)")
    folder = Path(tempfile.mkdtemp(prefix="authsrv-bench-"))
    server, base = start_server(folder)
    try:
        browser = requests.Session()
        opaque = code_flow(browser, base, "openid profile email offline_access")
        jwt_access = code_flow(browser, base, "openid profile", resource="https://api.demo.test")
        # Twice as many chains as connections: wrk asks for a request or two
        # before the first response comes back.
        chains = [code_flow(browser, base, "openid offline_access")["refresh_token"]
                  for _ in range(2 * args.connections)]
        sub = requests.get(base + "/api/auth/oauth2/userinfo",
                           headers={"Authorization": "Bearer " + opaque["access_token"]}).json()["sub"]
        form = {"Content-Type": "application/x-www-form-urlencoded", "Authorization": _basic(GATEWAY)}
        scenarios = [
            ("discovery", "/api/auth/.well-known/openid-configuration", None),
            ("JWKS", "/api/auth/jwks", None),
            ("introspection (opaque)", "/api/auth/oauth2/introspect",
             post_script("token=" + opaque["access_token"], form)),
            ("introspection (JWT)", "/api/auth/oauth2/introspect",
             post_script("token=" + jwt_access["access_token"], form)),
            ("UserInfo", "/api/auth/oauth2/userinfo",
             f'wrk.headers["Authorization"] = "Bearer {opaque["access_token"]}"\n'),
            ("user-access", "/api/internal/user-access",
             post_script(json.dumps({"userId": sub}), {"Content-Type": "application/json",
                                                       "Authorization": "Bearer " + INTERNAL_SECRET})),
            ("refresh (rotation)", "/api/auth/oauth2/token", refresh_script(chains)),
        ]
        # Codes live 60 s: made just before their run, more than it can use.
        code_seconds = min(args.duration, 5)
        print(f"| endpoint | req/s | p50 | p99 |  (c={args.connections}, {args.duration} s each)")
        print("|---|---|---|---|")
        for name, path, script in scenarios:
            rate, p50, p99 = wrk(base + path, script, args.duration, args.connections, folder)
            print(f"| {name} | {rate:,.0f} | {p50} | {p99} |", flush=True)
        codes, verifier = fresh_codes(browser, base, 2000 * code_seconds)
        rate, p50, p99 = wrk(base + "/api/auth/oauth2/token", code_script(codes, verifier), code_seconds,
                             args.connections, folder)
        print(f"| code exchange ({code_seconds} s) | {rate:,.0f} | {p50} | {p99} |", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=15)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
