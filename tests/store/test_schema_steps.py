"""
What every shipped schema step must be to upgrade a database that holds
rows: checked on the files, so that a step added later cannot break an
operator's upgrade on a table no upgrade test happens to fill.
"""

from __future__ import annotations

import re

import pytest

from authsrv.migrations import schema_steps

SCHEMAS = [
    ("authsrv.store", "sqlite"), ("authsrv.store", "postgres"), ("authsrv.keys", "postgres"),
    ("authsrv.identity", "postgres"),
]

_ADD_COLUMN = re.compile(r"ALTER TABLE \w+ ADD COLUMN [^;,]*", re.IGNORECASE)


@pytest.mark.parametrize(("package", "dialect"), SCHEMAS)
def test_versions_run_from_one_without_gaps(package, dialect):
    """Two steps of one number would both apply, or one of them never."""
    versions = [version for version, _, _ in schema_steps(package, dialect)]
    assert versions == list(range(1, len(versions) + 1))


@pytest.mark.parametrize(("package", "dialect"), SCHEMAS)
def test_a_column_added_not_null_has_a_default(package, dialect):
    """Without one, the step fails on the first table that has a row."""
    for _, name, script in schema_steps(package, dialect):
        code = "\n".join(line.split("--")[0] for line in script.splitlines())
        for added in _ADD_COLUMN.findall(code):
            if "NOT NULL" in added.upper():
                assert "DEFAULT" in added.upper(), f"{name}: {added}"
