#!/usr/bin/env bash
# What bench/bench.py needs besides the project's virtualenv: wrk and
# taskset (Debian), matplotlib (PyPI), Node.js with npm, and the peers from npm;
# valgrind (Debian) for bench/pg_instructions.py.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v taskset >/dev/null || need+=(util-linux)
command -v node >/dev/null || need+=(nodejs npm)
command -v valgrind >/dev/null || need+=(valgrind)
if ((${#need[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' matplotlib py-spy
(cd bench/peer && npm ci --no-audit --no-fund --silent)
(cd bench/better-auth && npm ci --no-audit --no-fund --silent)
