"""
What one request of each hot endpoint costs the server, in instructions: the
same number however busy or fast the machine is that day, where a rate or a
CPU time moves by a tenth between runs of one minute here, so a change of a
few percent can be seen at all. The demo's server (SQLite, the JWK-file
keystore, the static users file, as bench.py runs it) runs under valgrind's
callgrind with counting off; each target gets a warm-up, then counting is
switched on for --requests requests sent one at a time on one connection,
and the instructions of every thread of the server over those requests are
divided by their number. The client is not counted. With --src, the same is
counted for another checkout's authsrv, for a before/after in one sitting.
A sign-in is a whole browser sign-in with a fresh cookie jar, as bench.py's
login target makes it; "sign-in without argon2id" leaves out the password
pool's thread, to count the rest of it (argon2id under callgrind takes about
a second a check, so give it fewer --requests).

    .venv/bin/python bench/request_instructions.py
    .venv/bin/python bench/request_instructions.py --src BEFORE/src --out bench/results/NAME
    .venv/bin/python bench/request_instructions.py --only "sign-in without argon2id" --requests 40

The count leaves out what the kernel does (the commit's disk sync, the
socket) and the time spent waiting; it includes the RSA signature and
everything else a request runs in the process.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402

TARGETS = ("introspection (opaque)", "UserInfo", "user-access", "code exchange", "refresh (rotation)", "sign-in",
           "sign-in without argon2id")
SIGN_IN = TARGETS[-2:]
"""A whole browser sign-in as bench.py's login target makes it; the second leaves out the password pool's threads."""
WARM_UP = 30


class Requests:
    """One target's requests, sent one at a time on one keep-alive connection."""

    def __init__(self, server: bench.Authsrv, measure: bench.Measure, target: str, count: int):
        self.session = requests.Session()
        self.server, self.target = server, target
        opaque, _ = measure.tokens[server.name]
        self.access = opaque["access_token"]
        self.sub = measure.sub
        if target == "code exchange":
            self.codes, self.verifier = bench.many_codes(server, measure.browsers[server.name], count)
        if target == "refresh (rotation)":
            self.refresh = bench.tokens(server, measure.browsers[server.name])["refresh_token"]

    def one(self) -> None:
        s, server = self.session, self.server
        if self.target in SIGN_IN:
            bench.tokens(server, requests.Session())
            return
        if self.target == "introspection (opaque)":
            answer = s.post(server.introspect, data={"token": self.access}, auth=bench.GATEWAY)
        elif self.target == "UserInfo":
            answer = s.get(server.userinfo, headers={"Authorization": "Bearer " + self.access})
        elif self.target == "user-access":
            answer = s.post(server.user_access, json={"userId": self.sub},
                            headers={"Authorization": "Bearer " + bench.INTERNAL_SECRET})
        elif self.target == "code exchange":
            answer = s.post(server.token, auth=bench.DEMO_APP, data={
                "grant_type": "authorization_code", "code": self.codes.pop(), "redirect_uri": bench.REDIRECT_URI,
                "code_verifier": self.verifier})
        else:
            answer = s.post(server.token, auth=bench.DEMO_APP,
                            data={"grant_type": "refresh_token", "refresh_token": self.refresh})
            if answer.status_code == 200:
                self.refresh = answer.json()["refresh_token"]
        if answer.status_code != 200:
            raise SystemExit(f"request_instructions: {self.target}: {answer.status_code} {answer.text[:300]}")


def callgrind(pid: int, *options: str) -> None:
    subprocess.run(["callgrind_control", *options, str(pid)], check=True, stdout=subprocess.DEVNULL)


def counted(source: Path, targets: list[str], count: int, keep: bool, python: Path | None) -> dict[str, int]:
    """
    Instructions per request of each target, for the authsrv of C{source} on C{python} (the bench's
    server interpreter by default); C{keep}: leave callgrind's dumps.
    """
    folder = Path(tempfile.mkdtemp(prefix="authsrv-instructions-"))
    dumps = folder / "callgrind"
    server = bench.Authsrv(folder, store="sqlite", workers=1, postgres_dsn=None, source=source, python=python, wrapper=(
        "valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
        f"--callgrind-out-file={dumps}.%p"))
    pid = server.process.pid
    try:
        measure = bench.Measure(folder, 0)
        measure.prepare(server)
        figures = {}
        for target in targets:
            load = Requests(server, measure, target, WARM_UP + count)
            for _ in range(WARM_UP):
                load.one()
            callgrind(pid, "--zero")
            callgrind(pid, "--instr=on")
            for _ in range(count):
                load.one()
            callgrind(pid, "--instr=off")
            callgrind(pid, "--dump")
            figures[target] = _instructions(folder, pid, target) // count
            print(f"{source}: {target}: {figures[target]:,} instructions per request"
                  + (f" ({folder})" if keep else ""), file=sys.stderr, flush=True)
        return figures
    finally:
        server.stop()
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def _instructions(folder: Path, pid: int, target: str) -> int:
    """
    The newest dump's instructions over all threads (one file each, named
    C{callgrind.PID.DUMP-THREAD}); for "sign-in without argon2id", over all
    but the password pool's, whose dump names argon2's functions (as the
    caller or the called: callgrind names a function once, where it first
    comes).
    """
    dumps = {path: int(path.suffix[1:].split("-")[0]) for path in folder.glob(f"callgrind.{pid}.*-*")}
    newest = max(dumps.values())
    total = 0
    for path in (path for path, dump in dumps.items() if dump == newest):
        text = path.read_text(errors="replace")
        if target == SIGN_IN[1] and re.search(r"^c?fn=.*argon2", text, re.M):
            continue
        totals = re.search(r"^totals: (\d+)", text, re.M)
        total += int(totals.group(1)) if totals else 0
    return total


def _name(source: Path) -> str:
    """A source tree by its checkout's commit (and whether it is this one)."""
    commit = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or source.parent.name
    if source == bench.ROOT / "src":
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True).stdout.strip()
        return f"this checkout ({commit}{' with changes' if dirty else ''})"
    return f"`{commit}`"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="requests counted per target (default 200)")
    parser.add_argument("--only", help="targets, comma-separated (default: " + ", ".join(TARGETS) + ")")
    parser.add_argument("--src", type=Path, action="append", default=[],
                        help="another checkout's src/ to count as well (before/after)")
    parser.add_argument("--out", type=Path, help="write PATH.md and PATH.json")
    parser.add_argument("--keep", action="store_true", help="keep callgrind's dumps (for callgrind_annotate)")
    parser.add_argument("--python", type=Path, help="the interpreter the servers run on (default: the bench's,"
                        " .venv-server's where bench/setup.sh made it)")
    args = parser.parse_args()
    targets = args.only.split(",") if args.only else list(TARGETS)
    unknown = set(targets) - set(TARGETS)
    if unknown:
        raise SystemExit(f"request_instructions: unknown targets {sorted(unknown)}; choose from {TARGETS}")
    sources = [bench.ROOT / "src", *(path.resolve() for path in args.src)]
    python = args.python.absolute() if args.python else None
    rows = {str(source): counted(source, targets, args.requests, args.keep, python) for source in sources}
    names = [_name(Path(source)) for source in rows]
    lines = [f"Instructions per request of the server (callgrind, SQLite demo, one at a time, {args.requests}"
             " requests per target).", "",
             "| target | " + " | ".join(names) + (" | change |" if len(rows) == 2 else " |"),
             "|---" * (len(rows) + 1 + (len(rows) == 2)) + "|"]
    for target in targets:
        values = [figures[target] for figures in rows.values()]
        change = f" {values[0] / values[1] - 1:+.1%} |" if len(values) == 2 else ""
        lines.append(f"| {target} | " + " | ".join(f"{v:,}" for v in values) + " |" + change)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.with_suffix(".md").write_text(text)
        # Keyed by the checkouts' names, as in the table: a source's path is this machine's own.
        args.out.with_suffix(".json").write_text(json.dumps(dict(zip(names, rows.values())), indent=1))


if __name__ == "__main__":
    main()
