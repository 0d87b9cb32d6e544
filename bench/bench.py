"""
authsrv beside node-oidc-provider, in one run on one machine: both servers
pinned to core 0, the load (wrk, and a node driver for full sign-ins) pinned
to core 1, target by target alternating between the two within each repeat,
at each concurrency. Everything on 127.0.0.1, every loop bounded in count and
time.

    bench/setup.sh                      # once: wrk, taskset, node packages, .venv-server
    .venv/bin/python bench/bench.py [--store sqlite|postgres] [--workers N]
        [--repeats 3] [--duration 5] [--concurrency 1,16,64] [--only TARGET,...]
        [--seed-grants N] [--out bench/results/NAME]
    .venv/bin/python bench/bench.py --baseline OTHER/src   # this checkout against another, no peer

It writes NAME.md (the table: req/s, p50 and p99 of each server, the
authsrv/peer ratio of each repeat and their median, the machine and the
versions), NAME.json (every measurement) and NAME.png (the chart).
user-access has no peer: it is compared with a bare Klein route answering the
same JSON, run beside it the same way.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import hashlib
import html
import json
import os
import platform
import re
import secrets
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from html.parser import HTMLParser
from importlib import metadata
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qs, urljoin, urlsplit

import requests

from authsrv.identity.passwords import POOL_NAME as PASSWORD_POOL

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PEER = BENCH / "peer"
BETTER_AUTH = BENCH / "better-auth"
DEMO_APP = ("demo-app", "demo-app-secret")
GATEWAY = ("api-gateway", "api-gateway-secret")
REDIRECT_URI = "http://127.0.0.1:9000/callback"
RESOURCE = "https://api.demo.test"
INTERNAL_SECRET = "demo-internal-secret"
SERVER_CORE, LOAD_CORE, ALL_CORES = "0", "1", f"0-{os.cpu_count() - 1}"
PINNED = True
"""False for the several-instances run, which needs every core for its servers."""
SERVER_VENV = ROOT / ".venv-server"


def server_python() -> Path:
    """
    The interpreter the servers in Python run on: bench/setup.sh's virtualenv on the system's own
    CPython build (an optimized one, as a distribution or a container image ships it) where it made
    one, else this one (bench/README.md, "The interpreter").
    """
    made = SERVER_VENV / "bin" / "python"
    return made if made.exists() else Path(sys.executable)


PEER_LACKS = {"introspection (JWT)"}
"""node-oidc-provider refuses to introspect its JWT access tokens (unsupported_token_type)."""

BETTER_AUTH_TARGETS = {"discovery", "JWKS", "introspection (opaque)", "UserInfo", "code exchange", "refresh (rotation)"}
"""What Better Auth runs beside the PostgreSQL store: it has no login form of its own (its login page is the
application's) and no internal user-access endpoint."""

TARGETS = [
    "discovery", "JWKS", "introspection (opaque)", "introspection (JWT)", "UserInfo", "user-access",
    "code exchange", "refresh (rotation)", "login",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def basic(client: tuple[str, str]) -> str:
    return "Basic " + base64.b64encode(f"{client[0]}:{client[1]}".encode()).decode()


def wait_ready(url: str, process: subprocess.Popen, what: str, seconds: float = 30) -> None:
    for _ in range(int(seconds * 10)):
        if process.poll() is not None:
            raise SystemExit(f"bench: {what} exited with {process.returncode}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):  # a server under valgrind may take seconds to answer
            pass
        time.sleep(0.1)
    raise SystemExit(f"bench: {what} did not become ready at {url}")


class Server:
    """A server under test: its URLs and the process serving them."""

    name: str
    base: str
    process: subprocess.Popen
    discovery: str
    jwks: str
    authorize: str
    token: str
    introspect: str
    userinfo: str
    introspector = GATEWAY
    """The client that introspects the load's tokens."""
    audience: str | None = RESOURCE
    """The resource of the JWT access token, None where the server issues none for it."""

    def sign_in(self, browser: requests.Session) -> None:
        """Sign the browser in before authorize; servers with a login form are signed in through it instead."""

    def cpu_seconds(self) -> float:
        """CPU time the server's processes have used (user and system)."""
        return cpu_seconds(self.process.pid)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Authsrv(Server):
    name = "authsrv"

    def __init__(self, folder: Path, *, store: str, workers: int, postgres_dsn: str | None, seed_grants: int = 0,
                 identity: dict | None = None, source: Path | None = None, wrapper: tuple[str, ...] = (),
                 python: Path | None = None):
        """
        C{identity}: an [[identity]] section to use instead of the demo's static users file; C{source}:
        another checkout's src/ directory to run authsrv from instead of this one; C{wrapper}: a command
        the server runs under (valgrind, say), given more time to become ready; C{python}: the
        interpreter it runs on instead of L{server_python}.
        """
        python = python or server_python()
        shutil.copytree(ROOT / "examples", folder / "examples", ignore=shutil.ignore_patterns("demo-data"))
        port = free_port()
        config = folder / "examples" / "demo.toml"
        text = (config.read_text().replace("tcp:8080:", f"tcp:{port}:")
                # Rates and caps no run reaches, so every request pays for the checks and none is
                # refused: all the load comes from one address, where a deployment sees many.
                + '\n[rate_limits]\ndefault = "1000000/s"\ninternal = "1000000/s"\n'
                + "\n[throttle]\nchecks_per_address = 100000\nchecks_in_flight = 100000\nfailures_per_pair = 100000\nfailures_per_address = 100000\n"
                + "failures_per_account = 100000\n")
        text += "\n[limits]\npending_per_address = 1000000\nmax_connections_per_address = 0\n"
        if workers > 1:
            text = text.replace("[server]\n", f"[server]\nworkers = {workers}\n", 1)
        if identity is not None:
            import tomlkit

            text = re.sub(r'\[\[identity\]\]\nplugin = "static"\npath = "[^"]*"\n',
                          "[[identity]]\n" + tomlkit.dumps(identity), text)
        if store == "postgres":
            text = re.sub(r'\[store\]\nplugin = "sqlite"\npath = "[^"]*"\n',
                          f'[store]\nplugin = "postgres"\ndsn = "{postgres_dsn}"\n', text)
            text = re.sub(r'\[keystore\]\nplugin = "jwk-file"\npath = "[^"]*"\n',
                          f'[keystore]\nplugin = "postgres"\ndsn = "{postgres_dsn}"\n', text)
        config.write_text(text)
        self.config = config
        if seed_grants:
            where = ["--dsn", postgres_dsn] if store == "postgres" else \
                ["--sqlite", str(folder / "examples" / "demo-data" / "authsrv.sqlite3")]
            (folder / "examples" / "demo-data").mkdir(exist_ok=True)
            subprocess.run([sys.executable, str(BENCH / "seed.py"), *where, "--grants", str(seed_grants)], check=True,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.store_file = folder / "examples" / "demo-data" / "authsrv.sqlite3" if store == "sqlite" else None
        self.postgres_dsn = postgres_dsn
        self.base = f"http://127.0.0.1:{port}"
        issuer = self.base + "/api/auth"
        self.discovery = issuer + "/.well-known/openid-configuration"
        self.jwks = issuer + "/jwks"
        self.authorize = issuer + "/oauth2/authorize"
        self.token = issuer + "/oauth2/token"
        self.introspect = issuer + "/oauth2/introspect"
        self.userinfo = issuer + "/oauth2/userinfo"
        self.user_access = self.base + "/api/internal/user-access"
        env = None
        if source is not None:
            env = {**os.environ, "PYTHONPATH": str(source)}
            found = subprocess.run([python, "-c", "import authsrv; print(authsrv.__file__)"], env=env,
                                   cwd=folder, capture_output=True, text=True, check=True).stdout
            if not Path(found.strip()).is_relative_to(source):
                raise SystemExit(f"bench: {source} does not hold the authsrv that runs ({found.strip()})")
        self.process = subprocess.Popen(
            ["taskset", "-c", SERVER_CORE if PINNED else ALL_CORES, *wrapper, python, "-m", "twisted",
             "--log-file", os.devnull,
             "authsrv", "--config", str(config)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder, env=env,
        )
        wait_ready(self.base + "/readyz", self.process, "authsrv", 600 if wrapper else 30)


    def rss_mib(self) -> float:
        """The resident memory of the server process(es)."""
        total = 0
        for pid in [self.process.pid, *_children(self.process.pid)]:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        return total / 1024

    def store_mib(self) -> float:
        if self.store_file is not None:
            return sum(p.stat().st_size for p in self.store_file.parent.glob(self.store_file.name + "*")) / 2**20
        import psycopg2

        with psycopg2.connect(self.postgres_dsn) as connection, connection.cursor() as cursor:
            cursor.execute("SELECT pg_database_size(current_database())")
            return cursor.fetchone()[0] / 2**20


def cpu_seconds(pid: int) -> float:
    """
    CPU time (user and system) process C{pid} and its descendants have
    used: the living ones read one by one, those that have exited (a
    PostgreSQL backend or worker) from what C{pid} counts of the children it
    waited for, so the sum only grows.
    """
    ticks = 0
    for member in [pid, *_children(pid)]:
        fields = _stat_fields(Path(f"/proc/{member}/stat"))
        if fields is None:
            continue
        ticks += int(fields[11]) + int(fields[12])
        if member == pid:
            ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def _stat_fields(path: Path) -> list[str] | None:
    """The fields of a /proc stat file after the command name, or None once the process or thread has gone."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def thread_ticks(pid: int) -> dict[int, int]:
    """CPU ticks (user and system) of every thread of process C{pid} and its descendants, by thread id."""
    ticks = {}
    for member in [pid, *_children(pid)]:
        try:
            tasks = list(Path(f"/proc/{member}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            fields = _stat_fields(task / "stat")
            if fields is not None:
                ticks[int(task.name)] = int(fields[11]) + int(fields[12])
    return ticks


PASSWORD_THREADS = re.compile(rf'^Thread (\d+) \([^)]*\): "PoolThread-authsrv-{PASSWORD_POOL}-\d+"$', re.M)


def password_threads(pid: int) -> set[int]:
    """
    The thread ids of authsrv's password pool (argon2id runs there, one
    check per thread at a time), in process C{pid} and its workers, named
    by py-spy's dump of each.
    """
    found: set[int] = set()
    for member in [pid, *_children(pid)]:
        dump = subprocess.run([_py_spy(), "dump", "--pid", str(member)], capture_output=True, text=True, timeout=60)
        found |= {int(tid) for tid in PASSWORD_THREADS.findall(dump.stdout)}
    return found


def _py_spy() -> str:
    """py-spy, from the virtualenv bench/setup.sh installed it in, or else from PATH."""
    return shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def _children(pid: int) -> list[int]:
    try:
        found = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return found + [g for c in found for g in _children(c)]


class Peer(Server):
    name = "node-oidc-provider"

    def __init__(self):
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.discovery = self.base + "/.well-known/openid-configuration"
        self.jwks = self.base + "/jwks"
        self.authorize = self.base + "/auth"
        self.token = self.base + "/token"
        self.introspect = self.base + "/token/introspection"
        self.userinfo = self.base + "/me"
        self.process = subprocess.Popen(
            ["taskset", "-c", SERVER_CORE, "node", str(PEER / "server.mjs"), str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_ready(self.discovery, self.process, "node-oidc-provider")


class BetterAuth(Server):
    """Better Auth and its OAuth provider plugin (bench/better-auth/server.mjs) on a database of authsrv's cluster."""

    name = "Better Auth"
    introspector = DEMO_APP
    """Better Auth introspects only a client's own tokens (another client's read as inactive)."""
    audience = None

    def __init__(self, dsn: str):
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        issuer = self.base + "/api/auth"
        self.discovery = issuer + "/.well-known/openid-configuration"
        self.jwks = issuer + "/jwks"
        self.authorize = issuer + "/oauth2/authorize"
        self.token = issuer + "/oauth2/token"
        self.introspect = issuer + "/oauth2/introspect"
        self.userinfo = issuer + "/oauth2/userinfo"
        self.sign_in_url = issuer + "/sign-in/email"
        fields = dict(item.split("=", 1) for item in dsn.split())
        url = f"postgresql://{fields['user']}@{fields['host']}:{fields['port']}/{fields['dbname']}"
        self.process = subprocess.Popen(
            ["taskset", "-c", SERVER_CORE, "node", str(BETTER_AUTH / "server.mjs"), str(port), url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_ready(self.base + "/readyz", self.process, "Better Auth")

    def sign_in(self, browser: requests.Session) -> None:
        answer = browser.post(self.sign_in_url, json={"email": "alice@example.com", "password": "alice-password"})
        if answer.status_code != 200:
            raise SystemExit(f"bench: Better Auth sign-in: {answer.status_code} {answer.text[:300]}")


class BareKlein(Server):
    """The floor for user-access: a Klein route answering the same JSON to the same POST."""

    name = "bare Klein"

    def __init__(self):
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.user_access = self.base + "/api/internal/user-access"
        self.process = subprocess.Popen(
            ["taskset", "-c", SERVER_CORE, server_python(), str(BENCH / "bare_klein.py"), str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_ready(self.base + "/readyz", self.process, "bare Klein")


# --- getting real tokens, as a browser and a relying party would ---------------


class _Forms(HTMLParser):
    """The form holding a password field: its action and hidden fields."""

    def __init__(self):
        super().__init__()
        self.forms: list[tuple[str | None, dict, bool]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self.forms.append((attrs.get("action"), {}, False))
        elif tag == "input" and self.forms:
            action, fields, has_password = self.forms[-1]
            if attrs.get("type") == "hidden":
                fields[attrs["name"]] = attrs.get("value", "")
            self.forms[-1] = (action, fields, has_password or attrs.get("name") == "password")


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(32)
    return verifier, base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def authorization_code(server: Server, browser: requests.Session, challenge: str, resource: str | None,
                       scope: str) -> str:
    """A code from the authorize endpoint, through the login form when the browser has no session."""
    params = {"response_type": "code", "client_id": DEMO_APP[0], "redirect_uri": REDIRECT_URI,
              "scope": scope, "state": "bench", "code_challenge": challenge,
              "code_challenge_method": "S256"}
    if resource:
        params["resource"] = resource
    answer = browser.get(server.authorize, params=params, allow_redirects=False)
    posted = False
    for _ in range(10):
        if answer.status_code in (302, 303):
            location = urljoin(answer.url, answer.headers["location"])
            if location.startswith(REDIRECT_URI):
                return parse_qs(urlsplit(location).query)["code"][0]
            answer = browser.get(location, allow_redirects=False)
        elif answer.status_code == 200 and not posted:
            forms = _Forms()
            forms.feed(answer.text)
            action, fields = next((a, f) for a, f, has_password in forms.forms if has_password)
            posted = True
            answer = browser.post(urljoin(answer.url, action or answer.url), allow_redirects=False,
                                  data={**fields, "username": "alice", "password": "alice-password"})
        else:
            break
    raise SystemExit(f"bench: {server.name} gave no code: {answer.status_code} {answer.text[:300]}")


def tokens(server: Server, browser: requests.Session, resource: str | None = None,
           scope: str = "openid profile email offline_access") -> dict:
    verifier, challenge = pkce()
    code = authorization_code(server, browser, challenge, resource, scope)
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT_URI, "code_verifier": verifier}
    if resource:
        form["resource"] = resource
    answer = requests.post(server.token, auth=DEMO_APP, data=form)
    if answer.status_code != 200:
        raise SystemExit(f"bench: {server.name} token endpoint: {answer.status_code} {answer.text[:300]}")
    return answer.json()


def many_codes(server: Server, browser: requests.Session, count: int) -> tuple[list[str], str]:
    """C{count} codes from the signed-in browser, all with one PKCE pair, eight at a time."""
    verifier, challenge = pkce()
    cookies = browser.cookies.get_dict()
    params = {"response_type": "code", "client_id": DEMO_APP[0], "redirect_uri": REDIRECT_URI,
              "scope": "openid profile email", "state": "bench", "code_challenge": challenge,
              "code_challenge_method": "S256"}

    def one(_):
        with requests.Session() as session:
            session.cookies.update(cookies)
            codes = []
            for _ in range(count // 8 + 1):
                answer = session.get(server.authorize, params=params, allow_redirects=False)
                codes.append((time.monotonic(), parse_qs(urlsplit(answer.headers["location"]).query)["code"][0]))
            return codes

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        made = sorted(code for batch in pool.map(one, range(8)) for code in batch)
    # Oldest first: the load takes from the end, the freshest codes, so none expires before its turn.
    return [code for _, code in made[-count:]], verifier


# --- wrk -------------------------------------------------------------------------


def lua(value: str) -> str:
    return json.dumps(value)


def post_script(body: str, headers: dict[str, str]) -> str:
    lines = ['wrk.method = "POST"', f"wrk.body = {lua(body)}"]
    lines += [f"wrk.headers[{lua(k)}] = {lua(v)}" for k, v in headers.items()]
    return "\n".join(lines) + "\n"


def pool_script(pool: list[str], body: str, refill: bool) -> str:
    """Each request takes the next item of the pool into C{body}; C{refill}: each answer's refresh token goes back."""
    script = f"""
local pool = {{{", ".join(lua(item) for item in pool)}}}
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
wrk.headers["Authorization"] = {lua(basic(DEMO_APP))}
request = function()
  -- An empty pool sends a code nobody issued: its error answers show in the report.
  local item = table.remove(pool) or "exhausted"
  return wrk.format(nil, nil, nil, string.format({lua(body)}, item))
end
"""
    if refill:
        script += """
response = function(status, headers, body)
  local token = string.match(body, '"refresh_token":%s*"([^"]+)"')
  if token then table.insert(pool, token) end
end
"""
    return script


_before_load: list = []
"""Called just before the load starts: the profiler starts there, after a target's preparation."""


def run_from_load_start(measure: Measure, server: Server, target: str, connections: int,
                        readings: dict[str, Callable[[], object]]) -> tuple[dict, dict]:
    """
    C{measure.run}, with each of C{readings} taken when the load starts, after
    the target's preparation (a code exchange's codes are made before it): the
    result and those readings, for figures per request of the load alone.
    """
    marks: dict = {}
    _before_load[:] = [lambda: marks.update((name, read()) for name, read in readings.items())]
    try:
        return measure.run(server, target, connections), marks
    finally:
        _before_load.clear()


def wrk(url: str, script: str | None, duration: float, connections: int, folder: Path, *, background=False):
    """wrk's figures; C{background}: start it and return a function that waits for them."""
    command = ["taskset", "-c", LOAD_CORE if PINNED else ALL_CORES, "wrk", "-t1", f"-c{connections}", f"-d{int(duration)}s", "--latency",
               "--timeout", "10s"]
    if script:
        path = folder / f"script-{secrets.token_hex(4)}.lua"
        path.write_text(script)
        command += ["-s", str(path)]
    for hook in _before_load:
        hook()
    process = subprocess.Popen(command + [url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if background:
        return lambda: _wrk_figures(url, process, duration)
    return _wrk_figures(url, process, duration)


def _wrk_figures(url: str, process: subprocess.Popen, duration: float) -> dict:
    output, errors_text = process.communicate(timeout=duration + 60)
    if process.returncode:
        raise SystemExit(f"bench: wrk failed on {url}:\n{output}{errors_text}")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return {"rate": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),
            "count": int(re.search(r"(\d+) requests in", output).group(1)),
            "p50": _ms(re.search(r"^\s+50%\s+(\S+)", output, re.M).group(1)),
            "p99": _ms(re.search(r"^\s+99%\s+(\S+)", output, re.M).group(1)),
            "errors": int(errors.group(1)) if errors else 0}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def logins(server: Server, duration: float, concurrency: int) -> dict:
    options = {"authorize": server.authorize, "token": server.token, "client_id": DEMO_APP[0],
               "client_secret": DEMO_APP[1], "redirect_uri": REDIRECT_URI, "username": "alice",
               "password": "alice-password", "concurrency": concurrency, "duration": duration, "limit": 100000}
    for hook in _before_load:
        hook()
    run = subprocess.run(["taskset", "-c", LOAD_CORE, "node", str(PEER / "login-driver.mjs"), json.dumps(options)],
                         capture_output=True, text=True, timeout=duration + 120)
    if run.returncode:
        raise SystemExit(f"bench: the login driver failed on {server.name}:\n{run.stdout}{run.stderr}")
    result = json.loads(run.stdout)
    return {"rate": result["rate"], "count": result["count"], "p50": result["p50"] or 0.0, "p99": result["p99"] or 0.0,
            "errors": result["errors"], "first_error": result["firstError"]}


# --- one measurement -------------------------------------------------------------


CODE_RATE = 1500
"""Code exchanges a second the first repeat's codes are made for."""


class Measure:
    """Runs one target against one server at one concurrency, preparing what it uses just before."""

    def __init__(self, folder: Path, duration: float):
        self.folder, self.duration = folder, duration
        self.browsers: dict[str, requests.Session] = {}
        self.code_rates: dict[tuple[str, int], float] = {}
        self.tokens: dict[str, tuple[dict, dict]] = {}

    def prepare(self, server: Server) -> None:
        browser = requests.Session()
        server.sign_in(browser)
        opaque = tokens(server, browser)
        jwt_access = server.audience and tokens(server, browser, server.audience)
        self.browsers[server.name], self.tokens[server.name] = browser, (opaque, jwt_access)
        answer = requests.get(server.userinfo, headers={"Authorization": "Bearer " + opaque["access_token"]})
        self.sub = answer.json()["sub"]

    def load(self, server: Server, target: str, connections: int) -> tuple[str, str]:
        """The URL and wrk script of one of L{INSTANCE_TARGETS}, ready to start."""
        form = {"Content-Type": "application/x-www-form-urlencoded", "Authorization": basic(server.introspector)}
        opaque, _ = self.tokens[server.name]
        if target == "introspection (opaque)":
            return server.introspect, post_script("token=" + opaque["access_token"], form)
        if target == "UserInfo":
            return server.userinfo, f'wrk.headers["Authorization"] = {lua("Bearer " + opaque["access_token"])}\n'
        if target == "user-access":
            return server.user_access, post_script(
                json.dumps({"userId": self.sub}),
                {"Content-Type": "application/json", "Authorization": "Bearer " + INTERNAL_SECRET})
        chains = [tokens(server, self.browsers[server.name])["refresh_token"] for _ in range(2 * connections)]
        return server.token, pool_script(chains, "grant_type=refresh_token&refresh_token=%s", refill=True)

    def run(self, server: Server, target: str, connections: int) -> dict:
        d = self.duration
        form = {"Content-Type": "application/x-www-form-urlencoded", "Authorization": basic(server.introspector)}
        if target == "discovery":
            return wrk(server.discovery, None, d, connections, self.folder)
        if target == "JWKS":
            return wrk(server.jwks, None, d, connections, self.folder)
        if target == "login":
            return logins(server, d, connections)
        if target == "user-access":
            body = json.dumps({"userId": self.sub})
            headers = {"Content-Type": "application/json", "Authorization": "Bearer " + INTERNAL_SECRET}
            return wrk(server.user_access, post_script(body, headers), d, connections, self.folder)
        opaque, jwt_access = self.tokens[server.name]
        if target == "introspection (opaque)":
            return wrk(server.introspect, post_script("token=" + opaque["access_token"], form), d, connections,
                       self.folder)
        if target == "introspection (JWT)":
            return wrk(server.introspect, post_script("token=" + jwt_access["access_token"], form), d, connections,
                       self.folder)
        if target == "UserInfo":
            script = f'wrk.headers["Authorization"] = {lua("Bearer " + opaque["access_token"])}\n'
            return wrk(server.userinfo, script, d, connections, self.folder)
        browser = self.browsers[server.name]
        if target == "refresh (rotation)":
            # Twice as many chains as connections: wrk asks for a request or two before the first answer.
            chains = [tokens(server, browser)["refresh_token"] for _ in range(2 * connections)]
            script = pool_script(chains, "grant_type=refresh_token&refresh_token=%s", refill=True)
            return wrk(server.token, script, d, connections, self.folder)
        if target == "code exchange":
            # Codes live 60 s: made just before the run, twice the fastest rate this server reached
            # without errors in a repeat (never less than what a fast server uses at first). A slow
            # first repeat must not leave the next without codes: an exhausted pool's errors are
            # answered fast and would be timed as the server's rate.
            seconds = min(d, 5)
            rate = self.code_rates.get((server.name, connections), CODE_RATE)
            codes, verifier = many_codes(server, browser, int(2 * rate * seconds) + 100)
            body = f"grant_type=authorization_code&code=%s&redirect_uri={REDIRECT_URI}&code_verifier={verifier}"
            result = wrk(server.token, pool_script(codes, body, refill=False), seconds, connections, self.folder)
            if not result["errors"]:
                self.code_rates[(server.name, connections)] = max(rate, result["rate"])
            return result
        raise ValueError(target)


# --- the run -----------------------------------------------------------------------


ARGON2_TIMING = """
import time
from authsrv.identity.passwords import DEFAULT_HASHER
stored = DEFAULT_HASHER.hash("alice-password")
started = time.process_time()
for _ in range(20):
    DEFAULT_HASHER.verify(stored, "alice-password")
print((time.process_time() - started) / 20 * 1000)
"""


def argon2_ms() -> float:
    """CPU milliseconds of one check of the default argon2id parameters, on the server's core."""
    run = subprocess.run(["taskset", "-c", SERVER_CORE, server_python(), "-c", ARGON2_TIMING],
                         capture_output=True, text=True, check=True, timeout=300)
    return float(run.stdout)


SERVER_PYTHON_BUILD = ("import platform; print(platform.python_version(), '(built '"
                       " + ' '.join(platform.python_build()[1].split()) + ', ' + platform.python_compiler() + ')')")
"""The server interpreter's version and build, which tell a distribution's build from another."""


def _first_line(*command) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "not found"


def python_build(python: Path) -> str:
    return _first_line(str(python), "-c", SERVER_PYTHON_BUILD)


def versions() -> dict:
    peer = json.loads((PEER / "node_modules" / "oidc-provider" / "package.json").read_text())["version"]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())
    return {
        "machine": f"{cpu}, {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') >> 30} GiB",
        "kernel": platform.release(), "python": platform.python_version(),
        "server python": python_build(server_python()),
        "authsrv": metadata.version("authsrv"), "twisted": metadata.version("twisted"),
        "klein": metadata.version("klein"), "sqlite": sqlite3.sqlite_version,
        "node": _first_line("node", "--version"), "oidc-provider": peer, "wrk": _first_line("wrk", "--version"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--identity", choices=["static", "ldap"], default="static",
                        help="ldap: the user in a local slapd (the tests' tests/slapd.py), with the standing cache's"
                             " default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=int, default=5, help="seconds per measurement (default 5)")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--only", default=",".join(TARGETS), help="comma-separated targets")
    parser.add_argument("--profile", default=None, metavar="NAME",
                        help="instead of the comparison: py-spy flame graphs of authsrv, one per target at the"
                             " highest concurrency, as bench/profiles/NAME-TARGET.svg")
    parser.add_argument("--scale", default=None, metavar="N,N,...",
                        help="instead of the comparison: authsrv alone on stores seeded with N live grants each"
                             " (bench/seed.py), its rate, resident memory and store size at each")
    parser.add_argument("--soak", type=int, default=0, metavar="SECONDS",
                        help="instead of the comparison: introspection, UserInfo and refresh in turn at the highest"
                             " concurrency for SECONDS, the server's resident memory after every round")
    parser.add_argument("--instances", type=int, default=0, metavar="N",
                        help="instead of the comparison (PostgreSQL only): N instances on one database, each"
                             " loaded by its own wrk, against one instance; nothing pinned")
    parser.add_argument("--baseline", default=None, metavar="SRC",
                        help="instead of the comparison: this checkout's authsrv against the one in SRC (another"
                             " checkout's src/ directory), both on the server core, alternating; no peer")
    parser.add_argument("--baseline-python", default=None, metavar="PYTHON",
                        help="with --baseline: the interpreter SRC's authsrv runs on (a virtualenv's python with"
                             " authsrv's requirements), to compare interpreters on the same code")
    parser.add_argument("--database-apart", action="store_true",
                        help="PostgreSQL pinned to the load's core instead of the servers' (as a database on a"
                             " machine of its own would be): the comparison and --baseline")
    parser.add_argument("--out", default=None, help="results path without extension (default bench/results/<store>)")
    args = parser.parse_args()
    targets = [t for t in args.only.split(",") if t]
    unknown = set(targets) - set(TARGETS)
    if unknown:
        raise SystemExit(f"bench: unknown targets {sorted(unknown)}; choose from {TARGETS}")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    if args.workers > 1:
        # Several workers need every core: authsrv and the load then share them, the peer stays on one.
        global PINNED
        PINNED = False
    out = Path(args.out) if args.out else BENCH / "results" / (args.store + (f"-workers{args.workers}" if args.workers > 1 else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.baseline:
        return baseline(args, Path(args.baseline).resolve(), targets, concurrencies, out)
    if args.baseline_python:
        raise SystemExit("bench: --baseline-python goes with --baseline")
    for tool in ("wrk", "taskset", "node"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench: needs {tool} (bench/setup.sh installs it)")
    if not (PEER / "node_modules" / "oidc-provider").is_dir():
        raise SystemExit("bench: node-oidc-provider is not installed (bench/setup.sh installs it)")
    if args.store == "postgres" and not (BETTER_AUTH / "node_modules" / "better-auth").is_dir():
        raise SystemExit("bench: Better Auth is not installed (bench/setup.sh installs it)")

    if args.scale:
        return scale(args, [int(n) for n in args.scale.split(",")], targets, max(concurrencies), out)
    if args.soak:
        return soak(args, max(concurrencies), out)
    if args.instances:
        if args.store != "postgres":
            raise SystemExit("bench: --instances needs --store postgres, the store several instances share")
        return instances(args, args.instances, targets, max(concurrencies), out)
    folder = Path(tempfile.mkdtemp(prefix="authsrv-bench-"))
    cluster = directory = None
    servers: list[Server] = []
    try:
        dsn = None
        if args.store == "postgres":
            cluster, dsn = postgres_cluster(database_core(args))
        identity = None
        if args.identity == "ldap":
            directory = ldap_directory()
            identity = {"plugin": "ldap", **directory.backend_config()}
        authsrv = Authsrv(folder, store=args.store, workers=args.workers, postgres_dsn=dsn, identity=identity)
        peer, bare = Peer(), BareKlein()
        servers = [authsrv, peer, bare]
        better = None
        if args.store == "postgres":
            better = BetterAuth(cluster.database())
            servers.append(better)
        measure = Measure(folder, args.duration)
        for server in (peer, better, authsrv):
            if server is not None:
                measure.prepare(server)
        if args.profile:
            profile(measure, authsrv, targets, max(concurrencies), args.profile)
            return
        results = []
        for repeat in range(args.repeats):
            for target in targets:
                for connections in concurrencies:
                    pair = [authsrv, bare] if target == "user-access" else [authsrv, peer]
                    if target in PEER_LACKS:
                        pair = [authsrv]
                    if better is not None and target in BETTER_AUTH_TARGETS:
                        pair.append(better)
                    if repeat % 2:
                        pair.reverse()
                    for server in pair:
                        sign_ins = server is authsrv and target == "login"
                        readings: dict[str, Callable[[], object]] = {"cpu": server.cpu_seconds}
                        if sign_ins:
                            readings["threads"] = partial(thread_ticks, server.process.pid)
                        result, marks = run_from_load_start(measure, server, target, connections, readings)
                        result["cpu_ms"] = 1000 * (server.cpu_seconds() - marks["cpu"]) / max(1, result["count"])
                        if sign_ins:
                            after, argon2 = thread_ticks(server.process.pid), password_threads(server.process.pid)
                            spent = sum(after[t] - marks["threads"].get(t, 0) for t in argon2 if t in after)
                            result["argon2_cpu_ms"] = (1000 * spent / os.sysconf("SC_CLK_TCK")
                                                       / max(1, result["count"]))
                        result.update(server=server.name, target=target, connections=connections, repeat=repeat)
                        results.append(result)
                        print(f"repeat {repeat + 1}/{args.repeats} {target} c={connections} {server.name}: "
                              f"{result['rate']:,.0f} req/s p50 {result['p50']:.2f} ms p99 {result['p99']:.2f} ms"
                              f" CPU {result['cpu_ms']:.3f} ms/req"
                              + (f" ERRORS {result['errors']} {result.get('first_error') or ''}" if result["errors"] else ""),
                              file=sys.stderr, flush=True)
        info = {"store": args.store + (", LDAP identity" if args.identity == "ldap" else ""),
                "database": "on the load's core" if args.database_apart else "pinned with authsrv",
                "workers": args.workers, "repeats": args.repeats, "duration": args.duration, **versions()}
        if "login" in targets and args.identity == "static":
            info["argon2_ms"] = argon2_ms()
        if better is not None:
            info["better-auth"] = json.loads((BETTER_AUTH / "node_modules" / "better-auth" / "package.json")
                                             .read_text())["version"]
        report(results, info, targets, concurrencies, out)
    finally:
        for server in servers:
            server.stop()
        if cluster is not None:
            cluster.destroy()
        if directory is not None:
            directory.destroy()
        shutil.rmtree(folder, ignore_errors=True)


def ldap_directory():
    """The tests' own slapd, with the demo's alice in it, pinned with authsrv (as a directory server would be)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from slapd import Slapd, user_attributes, user_dn

    from authsrv.records import User

    directory = Slapd()
    alice = User(sub="sub-alice", login="alice", name="Alice", email="alice@example.com", email_verified=True)
    directory.put(user_dn("alice"), user_attributes(alice, "alice-password"))
    subprocess.run(["taskset", "-a", "-p", "-c", SERVER_CORE, str(directory.process.pid)], check=True,
                   capture_output=True)
    return directory


def profile(measure: Measure, authsrv: Authsrv, targets: list[str], connections: int, name: str) -> None:
    """
    A py-spy flame graph of the server's reactor and store threads while they
    hold the GIL (their CPU, not their waiting), recorded from the load's core
    while each target's load runs. py-spy stops the server for each sample:
    read while it runs (--nonblocking), most samples were lost, those in
    Python code more than those in long C calls (bench/README.md).
    """
    folder = BENCH / "profiles"
    folder.mkdir(exist_ok=True)
    for target in targets:
        slug = re.sub(r"[^a-z0-9]+", "-", target.lower()).strip("-")
        path = folder / f"{name}-{slug}.{'txt' if os.environ.get('BENCH_RAW') else 'svg'}"
        spies = []

        def start(path=path):
            spies.append(subprocess.Popen(
                ["taskset", "-c", LOAD_CORE, _py_spy(),
                 "record", "--pid", str(authsrv.process.pid), "--rate", "250", "--output", str(path),
                 "--format", "raw" if os.environ.get("BENCH_RAW") else "flamegraph", "--gil"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(0.5)

        _before_load[:] = [start]
        result = measure.run(authsrv, target, connections)
        _before_load.clear()
        for spy in spies:
            spy.send_signal(2)
            spy.wait(timeout=60)
        if path.suffix == ".svg" and path.exists():
            retitle(path, f"authsrv, {target}, c={connections}: py-spy, samples holding the GIL")
        print(f"{target}: {result['rate']:,.0f} req/s under py-spy -> {path.relative_to(ROOT)}", file=sys.stderr)


def retitle(path: Path, title: str) -> None:
    """
    Give a flame graph C{title} in place of py-spy's own, its command line,
    which names this machine's paths.
    """
    text = path.read_text()
    path.write_text(re.sub(r'(<text id="title"[^>]*>)[^<]*(</text>)',
                           lambda m: m.group(1) + html.escape(title) + m.group(2), text, count=1))


def scale(args, sizes: list[int], targets: list[str], connections: int, out: Path) -> None:
    """authsrv's rate at each store size, with its memory and the store's size."""
    rows = []
    for size in sizes:
        folder = Path(tempfile.mkdtemp(prefix="authsrv-bench-"))
        cluster, dsn = postgres_cluster() if args.store == "postgres" else (None, None)
        started = time.perf_counter()
        authsrv = Authsrv(folder, store=args.store, workers=args.workers, postgres_dsn=dsn, seed_grants=size)
        seeded = time.perf_counter() - started
        try:
            measure = Measure(folder, args.duration)
            measure.prepare(authsrv)
            rates = {t: statistics.median(measure.run(authsrv, t, connections)["rate"] for _ in range(args.repeats))
                     for t in targets if t not in ("login", "discovery", "JWKS")}
            rows.append({"grants": size, "seconds_to_seed": seeded, "store_mib": authsrv.store_mib(),
                         "rss_mib": authsrv.rss_mib(), "rates": rates})
            print(f"{size:,} grants: {rows[-1]}", file=sys.stderr, flush=True)
        finally:
            authsrv.stop()
            if cluster is not None:
                cluster.destroy()
            shutil.rmtree(folder, ignore_errors=True)
    names = list(rows[0]["rates"])
    lines = [f"authsrv ({args.store} store) alone, c={connections}, median of {args.repeats} runs of"
             f" {args.duration} s; each store seeded by bench/seed.py (grant, consent, access and refresh token"
             " per grant) before the server starts.", "",
             "| live grants | seeded in | store MiB | server RSS MiB | " + " | ".join(f"{n} req/s" for n in names) + " |",
             "|---" * (4 + len(names)) + "|"]
    base = rows[0]["rates"]
    for row in rows:
        lines.append(f"| {row['grants']:,} | {row['seconds_to_seed']:.0f} s | {row['store_mib']:,.0f}"
                     f" | {row['rss_mib']:,.0f} | " + " | ".join(
                         f"{row['rates'][n]:,.0f} ({row['rates'][n] / base[n]:.2f}x)" for n in names) + " |")
    table = "\n".join(lines) + "\n"
    out = out.with_name(out.name + "-scale")
    out.with_suffix(".md").write_text(table)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(table)


def baseline(args, source: Path, targets: list[str], concurrencies: list[int], out: Path) -> None:
    """
    This checkout's authsrv ("after") against the one in C{source} ("before"), on the same
    configuration and the same core, target by target alternating between the two within each repeat.
    On PostgreSQL each has its own database in one cluster, pinned with them.
    """
    if args.workers != 1 or args.identity != "static":
        raise SystemExit("bench: --baseline runs one worker and the static users file")
    before_python = Path(args.baseline_python).absolute() if args.baseline_python else None
    folder = Path(tempfile.mkdtemp(prefix="authsrv-bench-"))
    cluster, _ = postgres_cluster(database_core(args)) if args.store == "postgres" else (None, None)
    servers: list[Authsrv] = []

    def database_cpu() -> float:
        """PostgreSQL's CPU so far: during one server's run, what that server's statements cost it."""
        return 0.0 if cluster is None else cpu_seconds(cluster.postmaster_pid())

    try:
        for name, src, python in (("before", source, before_python), ("after", None, None)):
            (folder / name).mkdir()
            dsn = cluster.database() if cluster is not None else None
            server = Authsrv(folder / name, store=args.store, workers=1, postgres_dsn=dsn, source=src, python=python)
            server.name = name
            servers.append(server)
        measure = Measure(folder, args.duration)
        for server in servers:
            measure.prepare(server)
        results = []
        for repeat in range(args.repeats):
            for target in targets:
                for connections in concurrencies:
                    for server in servers[::-1] if repeat % 2 else servers:
                        result, marks = run_from_load_start(measure, server, target, connections,
                                                            {"cpu": server.cpu_seconds, "database": database_cpu})
                        result["cpu_ms"] = 1000 * (server.cpu_seconds() - marks["cpu"]) / max(1, result["count"])
                        result["db_cpu_ms"] = 1000 * (database_cpu() - marks["database"]) / max(1, result["count"])
                        result.update(server=server.name, target=target, connections=connections, repeat=repeat)
                        results.append(result)
                        print(f"repeat {repeat + 1}/{args.repeats} {target} c={connections} {server.name}:"
                              f" {result['rate']:,.0f} req/s CPU {result['cpu_ms']:.3f} ms/req"
                              + (f" ERRORS {result['errors']}" if result["errors"] else ""), file=sys.stderr, flush=True)
    finally:
        for server in servers:
            server.stop()
        if cluster is not None:
            cluster.destroy()
        shutil.rmtree(folder, ignore_errors=True)
    where = "SQLite store" if cluster is None else (
        "PostgreSQL store (a database each in one cluster, "
        + ("pinned to the load's core)" if args.database_apart else "pinned with them)"))
    cpu = "CPU ms/req" if cluster is None else "CPU ms/req (authsrv + PostgreSQL)"
    interpreters = "" if before_python is None else (
        f", before on Python {python_build(before_python)}, after on Python {python_build(server_python())}")
    lines = [f"authsrv before (the checkout --baseline named) and after (this checkout), {where}{interpreters}, both pinned"
             f" to one core, the load on the other; {args.repeats} repeats of {args.duration} s, alternating. Ratio:"
             " after/before in each repeat, then their median.", "",
             f"| endpoint | c | before req/s | {cpu} | after req/s | {cpu} | ratio per repeat | median ratio |",
             "|---|---|---|---|---|---|---|---|"]

    def spent(figures: dict) -> str:
        return f"{figures['cpu_ms']:.3f}" + ("" if cluster is None else f" + {figures['db_cpu_ms']:.3f}")

    for target in targets:
        for c in concurrencies:
            runs = {name: sorted((r for r in results if (r["server"], r["target"], r["connections"]) == (name, target, c)),
                                 key=lambda r: r["repeat"]) for name in ("before", "after")}
            ratios = [a["rate"] / b["rate"] for a, b in zip(runs["after"], runs["before"]) if b["rate"]]
            figures = {name: {k: statistics.median(r[k] for r in rs) for k in ("rate", "cpu_ms", "db_cpu_ms")}
                       for name, rs in runs.items()}
            lines.append(f"| {target} | {c} | {figures['before']['rate']:,.0f} | {spent(figures['before'])}"
                         f" | {figures['after']['rate']:,.0f} | {spent(figures['after'])}"
                         f" | {' · '.join(f'{r:.2f}' for r in ratios)} | **{statistics.median(ratios):.2f}** |")
    lines += ["", f"Errors (non-2xx answers): {sum(r['errors'] for r in results)}."]
    table = "\n".join(lines) + "\n"
    out = out.with_name(out.name + "-baseline")
    out.with_suffix(".md").write_text(table)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(table)


def soak(args, connections: int, out: Path) -> None:
    """Rounds of load until C{args.soak} seconds have passed, the server's memory after each."""
    folder = Path(tempfile.mkdtemp(prefix="authsrv-bench-"))
    cluster, dsn = postgres_cluster() if args.store == "postgres" else (None, None)
    authsrv = Authsrv(folder, store=args.store, workers=args.workers, postgres_dsn=dsn)
    samples = []
    try:
        measure = Measure(folder, args.duration)
        measure.prepare(authsrv)
        samples.append((0.0, authsrv.rss_mib(), 0.0))
        started = time.monotonic()
        while time.monotonic() - started < args.soak:
            for target in ("introspection (opaque)", "UserInfo", "refresh (rotation)"):
                rate = measure.run(authsrv, target, connections)["rate"]
            samples.append((time.monotonic() - started, authsrv.rss_mib(), rate))
            print(f"soak {samples[-1][0]:.0f} s: RSS {samples[-1][1]:.1f} MiB", file=sys.stderr, flush=True)
    finally:
        authsrv.stop()
        if cluster is not None:
            cluster.destroy()
        shutil.rmtree(folder, ignore_errors=True)
    lines = [f"authsrv ({args.store} store), introspection, UserInfo and refresh in turn at c={connections},"
             f" {args.duration} s each, for {args.soak} s; the server's resident memory after each round.", "",
             "| seconds | RSS MiB | refresh req/s |", "|---|---|---|"]
    lines += [f"| {t:.0f} | {rss:.1f} | {rate:,.0f} |" for t, rss, rate in samples]
    half = samples[len(samples) // 2][1]
    lines += ["", f"From the middle of the run to its end: {samples[-1][1] - half:+.1f} MiB."]
    table = "\n".join(lines) + "\n"
    out = out.with_name(out.name + "-soak")
    out.with_suffix(".md").write_text(table)
    print(table)


def instances(args, count: int, targets: list[str], connections: int, out: Path) -> None:
    """
    One instance, then C{count} on the same database, each loaded by a wrk of
    its own with its share of the connections (a balancer's own cost left out);
    with the CPU the instances and PostgreSQL spend per request, from which
    the scaling on a bigger machine can be projected.
    """
    global PINNED
    PINNED = False
    folder = Path(tempfile.mkdtemp(prefix="authsrv-bench-"))
    cluster, dsn = postgres_cluster(core=None)
    servers = []
    rows = []
    try:
        for n in range(count):
            (folder / str(n)).mkdir()
            servers.append(Authsrv(folder / str(n), store="postgres", workers=1, postgres_dsn=dsn))
        measures = []
        for server in servers:
            measure = Measure(folder, args.duration)
            measure.prepare(server)
            measures.append(measure)
        database = cluster.postmaster_pid()
        for target in [t for t in targets if t in INSTANCE_TARGETS]:
            for used in (1, count):
                share = max(1, connections // used)
                loads = [measures[i].load(servers[i], target, share) for i in range(used)]
                cpu = [s.cpu_seconds() for s in servers[:used]], cpu_seconds(database)
                waits = [wrk(url, script, args.duration, share, folder, background=True) for url, script in loads]
                figures = [wait() for wait in waits]
                total = sum(f["count"] for f in figures)
                app_cpu = sum(s.cpu_seconds() for s in servers[:used]) - sum(cpu[0])
                db_cpu = cpu_seconds(database) - cpu[1]
                rows.append({"target": target, "instances": used, "rate": sum(f["rate"] for f in figures),
                             "errors": sum(f["errors"] for f in figures),
                             "authsrv_cpu_ms": 1000 * app_cpu / max(1, total),
                             "postgres_cpu_ms": 1000 * db_cpu / max(1, total)})
                print(f"{target} x{used}: {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        for server in servers:
            server.stop()
        cluster.destroy()
        shutil.rmtree(folder, ignore_errors=True)
    lines = [f"authsrv on one PostgreSQL database: 1 instance, then {count}, each loaded by its own wrk with"
             f" its share of {connections} connections for {args.duration} s; nothing pinned ({os.cpu_count()} cores"
             " for the instances, PostgreSQL and wrk together). CPU ms/req: what the instances and PostgreSQL"
             " spent per request answered.", "",
             "| endpoint | instances | req/s | authsrv CPU ms/req | PostgreSQL CPU ms/req | errors |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['target']} | {r['instances']} | {r['rate']:,.0f} | {r['authsrv_cpu_ms']:.3f}"
              f" | {r['postgres_cpu_ms']:.3f} | {r['errors']} |" for r in rows]
    table = "\n".join(lines) + "\n"
    out = out.with_name(out.name + f"-instances{count}")
    out.with_suffix(".md").write_text(table)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(table)


INSTANCE_TARGETS = ("introspection (opaque)", "UserInfo", "user-access", "refresh (rotation)")


def database_core(args) -> str:
    """The core PostgreSQL's processes are pinned to: the servers' unless C{--database-apart}."""
    return LOAD_CORE if args.database_apart else SERVER_CORE


def postgres_cluster(core: str | None = SERVER_CORE):
    """
    A throwaway PostgreSQL (the tests' helper), its server processes pinned
    to C{core} (None: unpinned); fsync on, so each commit waits for the disk as in production.
    """
    sys.path.insert(0, str(ROOT / "tests"))
    from pgcluster import Cluster

    cluster = Cluster(local=True, fsync=True)
    dsn = cluster.database()
    pid = (Path(cluster._folder) / "data" / "postmaster.pid").read_text().split()[0]
    cluster.postmaster_pid = lambda: int(pid)
    if core is not None:
        subprocess.run(["taskset", "-a", "-p", "-c", core, pid], check=True, capture_output=True)
    return cluster, dsn


def report(results: list[dict], info: dict, targets: list[str], concurrencies: list[int], out: Path) -> None:
    def of(server_names, target, connections):
        return sorted((r for r in results if r["target"] == target and r["connections"] == connections
                       and r["server"] in server_names), key=lambda r: r["repeat"])

    rows = []
    better = any(r["server"] == BetterAuth.name for r in results)
    lines = [
        f"authsrv ({info['store']} store{', %d workers' % info['workers'] if info['workers'] > 1 else ''}"
        f"{', the database ' + info['database'] if info['database'] != 'pinned with authsrv' else ''})"
        f" and node-oidc-provider {info['oidc-provider']} (in memory), "
        + ("both pinned to one core, the load on the other; " if info["workers"] == 1 else
           "authsrv's workers and the load unpinned on every core, the peer pinned to one; ")
        + f"{info['repeats']} repeats of {info['duration']:g} s, alternating. Ratio: authsrv/peer in each"
        " repeat, then their median (user-access: authsrv/bare Klein route). CPU ms/req: the server's"
        " processes' CPU time during the load over the requests answered (a figure other load on the"
        " machine disturbs less than the rate)."
        + (f" Better Auth {info.get('better-auth')} with its OAuth provider plugin runs in the same alternation on"
           f" its own database of the same PostgreSQL cluster, {info['database']}; its ratio is authsrv/Better Auth."
           if better else ""),
        "",
        "| endpoint | c | authsrv req/s | p50 ms | p99 ms | CPU ms/req | peer req/s | p50 ms | p99 ms | CPU ms/req"
        " | ratio per repeat | median ratio |" + (" Better Auth req/s | p99 ms | CPU ms/req | ratio per repeat"
                                                  " | median ratio |" if better else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|---|" if better else ""),
    ]
    for target in targets:
        for c in concurrencies:
            ours = of({"authsrv"}, target, c)
            theirs = of({"node-oidc-provider", "bare Klein"}, target, c)
            ratios = [a["rate"] / b["rate"] if b["rate"] else float("inf") for a, b in zip(ours, theirs)]
            median = statistics.median(ratios) if ratios else float("nan")

            def m(rs, key):
                return statistics.median(r[key] for r in rs) if rs else float("nan")

            row = {"target": target, "connections": c, "ratios": ratios, "median_ratio": median,
                   "authsrv": {k: m(ours, k) for k in ("rate", "p50", "p99", "cpu_ms")},
                   "peer": {k: m(theirs, k) for k in ("rate", "p50", "p99", "cpu_ms")}}
            line = (f"| {target} | {c} | {m(ours, 'rate'):,.0f} | {m(ours, 'p50'):.2f} | {m(ours, 'p99'):.2f}"
                    f" | {m(ours, 'cpu_ms'):.3f} | {m(theirs, 'rate'):,.0f} | {m(theirs, 'p50'):.2f}"
                    f" | {m(theirs, 'p99'):.2f} | {m(theirs, 'cpu_ms'):.3f}"
                    f" | {' · '.join(f'{r:.2f}' for r in ratios) or 'peer refuses'} | **{median:.2f}** |")
            if better:
                others = of({BetterAuth.name}, target, c)
                by_repeat = {r["repeat"]: r for r in ours}
                row["better_auth_ratios"] = [by_repeat[b["repeat"]]["rate"] / b["rate"] for b in others
                                             if b["repeat"] in by_repeat and b["rate"]]
                row["better_auth_median_ratio"] = (statistics.median(row["better_auth_ratios"])
                                                   if row["better_auth_ratios"] else float("nan"))
                row["better_auth"] = {k: m(others, k) for k in ("rate", "p50", "p99", "cpu_ms")}
                line += (f" {m(others, 'rate'):,.0f} | {m(others, 'p99'):.2f} | {m(others, 'cpu_ms'):.3f}"
                         f" | {' · '.join(f'{r:.2f}' for r in row['better_auth_ratios']) or '—'}"
                         f" | **{row['better_auth_median_ratio']:.2f}** |")
            rows.append(row)
            lines.append(line.replace("nan", "—"))
    errors = sum(r["errors"] for r in results)
    if "argon2_ms" in info:
        sign_ins = [r for r in results if r["server"] == "authsrv" and r["target"] == "login"]
        per_login = statistics.median(r["cpu_ms"] for r in sign_ins)
        in_server = statistics.median(r["argon2_cpu_ms"] for r in sign_ins)
        lines += ["", f"One argon2id check (the default m=19 MiB, t=2, p=1) costs {info['argon2_ms']:.1f} ms of CPU alone"
                  f" on the server's core. During the sign-ins, authsrv's password threads (where argon2id runs)"
                  f" used {in_server:.1f} ms of CPU per sign-in, of the"
                  f" {per_login:.1f} ms a whole sign-in cost (medians): argon2id is {100 * in_server / per_login:.0f} %"
                  f" of a sign-in's CPU ({100 * info['argon2_ms'] / per_login:.0f} % counting the check alone), and"
                  f" one core signs in about {1000 / per_login:.0f} users a second."]
    lines += ["", f"Errors (non-2xx answers or failed sign-ins): {errors}.", "",
              "Machine and versions: " + "; ".join(f"{k} {v}" for k, v in info.items()
                                                   if k not in ("store", "database", "workers", "repeats", "duration", "argon2_ms"))
              + "."]
    table = "\n".join(lines) + "\n"
    out.with_suffix(".md").write_text(table)
    out.with_suffix(".json").write_text(json.dumps({"info": info, "rows": rows, "results": results}, indent=1))
    chart(rows, targets, concurrencies, info, out.with_suffix(".png"))
    print(table)


def chart(rows: list[dict], targets: list[str], concurrencies: list[int], info: dict, path: Path) -> None:
    """The median ratios against the node peer, and against Better Auth when it ran (target 10x, dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("median_ratio", targets, 1.5, f"node-oidc-provider {info['oidc-provider']}, one core each"
               " (user-access: beside a bare Klein route)")]
    if "better-auth" in info:
        panels.append(("better_auth_median_ratio", [t for t in targets if t in BETTER_AUTH_TARGETS], 10.0,
                       f"Better Auth {info['better-auth']} on the same PostgreSQL"))
    figure, axes = plt.subplots(len(panels), 1, figsize=(11, 5 * len(panels)), squeeze=False)
    width = 0.8 / len(concurrencies)
    for axis, (key, shown, goal, peer) in zip(axes[:, 0], panels):
        for i, c in enumerate(concurrencies):
            values = [next(r[key] for r in rows if r["target"] == t and r["connections"] == c) for t in shown]
            axis.bar([x + i * width for x in range(len(shown))], values, width, label=f"c={c}")
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.axhline(goal, color="grey", linewidth=0.8, linestyle="--")
        axis.set_xticks([x + width * (len(concurrencies) - 1) / 2 for x in range(len(shown))])
        axis.set_xticklabels(shown, rotation=20, ha="right")
        axis.set_ylabel("authsrv / peer, req/s (median of repeats)")
        axis.set_title(f"authsrv ({info['store']}) beside {peer}")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
