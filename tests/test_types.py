"""
The package type-checks: mypy with the mypy-zope plugin, as configured in
pyproject.toml's [tool.mypy], reports no error. A failure shows mypy's own
report. Slow because a run without mypy's cache checks every module.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_package_type_checks():
    mypy = Path(sys.executable).parent / "mypy"
    result = subprocess.run(
        [str(mypy), "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout, result.stdout
