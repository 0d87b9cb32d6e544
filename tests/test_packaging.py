"""
What `pip install .` installs: the dropin without any __init__.py above it
(so Twisted's plugin folders stay namespace folders), and the package data.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def test_wheel_ships_the_dropin_and_schema(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("authsrv-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "twisted/plugins/authsrv_plugins.py" in names
    assert "twisted/__init__.py" not in names
    assert "twisted/plugins/__init__.py" not in names
    assert any(n.startswith("authsrv/store/schema/sqlite/") and n.endswith(".sql") for n in names)
    assert not any("dropin.cache" in n for n in names)
