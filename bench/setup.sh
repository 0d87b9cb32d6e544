#!/usr/bin/env bash
# What bench/bench.py needs besides the project's virtualenv: wrk and
# taskset (Debian), matplotlib (PyPI), Node.js with npm, and the peers from npm;
# valgrind (Debian) for bench/pg_instructions.py.
set -euo pipefail
cd "$(dirname "$0")/.."
# The servers in Python run on the system's own CPython where it has one (Debian's is built with
# profile-guided and link-time optimization, as container images' are; a build from source without
# --enable-optimizations, as pyenv makes by default, runs its Python code slower):
# bench/README.md, "The interpreter". AUTHSRV_BENCH_PYTHON names another.
server_python="${AUTHSRV_BENCH_PYTHON:-/usr/bin/python3}"
if [ -n "${AUTHSRV_BENCH_PYTHON:-}" ]; then
    [ -x "$server_python" ] || { echo "bench/setup.sh: AUTHSRV_BENCH_PYTHON=$server_python is not an executable" >&2; exit 1; }
elif [ ! -x "$server_python" ]; then
    server_python=python3
fi
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v taskset >/dev/null || need+=(util-linux)
command -v node >/dev/null || need+=(nodejs npm)
command -v valgrind >/dev/null || need+=(valgrind)
[ "$server_python" != /usr/bin/python3 ] || "$server_python" -c "import ensurepip" 2>/dev/null || need+=(python3-venv)
if ((${#need[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' matplotlib py-spy
[ -x .venv-server/bin/python ] || "$server_python" -m venv .venv-server
.venv-server/bin/python -m pip install -q --disable-pip-version-check -e .
(cd bench/peer && npm ci --no-audit --no-fund --silent)
(cd bench/better-auth && npm ci --no-audit --no-fund --silent)
