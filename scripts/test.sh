#!/usr/bin/env bash
# Everything the test suite needs, from a fresh Debian machine: the Debian
# packages the tests start for real (slapd, PostgreSQL, Chromium, node), a virtualenv
# with the project and its test extras, the npm packages of tests/js, then pytest on two workers (pytest-xdist)
# that steal work from each other, so neither idles while the other finishes a long
# file (each builds its own session fixtures: a PostgreSQL cluster, slapd).
# Extra arguments go to pytest after these, so `-n 0` runs everything in one process.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(slapd ldap-utils postgresql chromium chromium-driver nodejs)
# Debian's nodejs comes without npm; other builds of nodejs bring their own.
command -v npm >/dev/null || packages+=(npm)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "installing Debian packages: ${missing[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
# openid-client, an independent relying party the machine-client tests drive with node.
npm ci --prefix tests/js --silent --no-audit --no-fund
exec .venv/bin/python -m pytest -n 2 --dist worksteal "$@"
