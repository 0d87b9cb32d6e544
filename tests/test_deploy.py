"""
The systemd unit in deploy/: the hardening it promises, a stop timeout that
outlasts the drain, and systemd's own verdict on it where systemd-analyze
is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from authsrv.config import Shutdown
from authsrv.configsection import parse_duration

from conftest import ROOT

UNIT = ROOT / "deploy" / "authsrv.service"
SYSUSERS = ROOT / "deploy" / "authsrv.sysusers"


def directives(text: str) -> dict[str, list[str]]:
    """Each key of the unit file with all its values, in order."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_unit_hardening_and_stop_timeout():
    unit = directives(UNIT.read_text())
    expected = {
        "User": ["authsrv"],
        "NoNewPrivileges": ["yes"],
        "ProtectSystem": ["strict"],
        "ProtectHome": ["yes"],
        "PrivateTmp": ["yes"],
        "ReadWritePaths": ["/var/lib/authsrv"],
        "CapabilityBoundingSet": [""],
        "AmbientCapabilities": [""],
        "RestrictAddressFamilies": ["AF_INET AF_INET6 AF_UNIX"],
        "SystemCallFilter": ["@system-service"],
        "KillSignal": ["SIGTERM"],
    }
    assert {key: unit.get(key) for key in expected} == expected
    assert "ExecReload" not in unit, "reload is a restart: the server handles no SIGHUP"
    drain = Shutdown()
    assert parse_duration(unit["TimeoutStopSec"][0]) > drain.delay + drain.timeout
    assert unit["ExecStart"][0].split()[1:] == ["authsrv", "--config", "/etc/authsrv/authsrv.toml"]
    user = SYSUSERS.read_text().splitlines()[-1].split()
    assert user[:2] == ["u", "authsrv"] and user[-1] == "/var/lib/authsrv"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    twist = Path(sys.executable).parent / "twist"
    unit = tmp_path / "authsrv.service"
    unit.write_text(re.sub(r"^ExecStart=\S+", f"ExecStart={twist}", UNIT.read_text(), flags=re.M))
    verified = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                              capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr
    security = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
                              capture_output=True, text=True, timeout=60)
    exposure = re.search(r"Overall exposure level for \S+: ([\d.]+)", security.stdout + security.stderr)
    assert exposure and float(exposure.group(1)) <= 2.0, security.stdout[-2000:] + security.stderr
