"""The versioned schema steps shipped with a package, for every database."""

from __future__ import annotations

import re
from importlib import resources

_STEP_NAME = re.compile(r"(\d{3})_\w+\.sql")


def schema_steps(package: str, dialect: str) -> list[tuple[int, str, str]]:
    """(version, file name, SQL) of every C{schema/<dialect>/NNN_*.sql} step of C{package}, in order."""
    folder = resources.files(package).joinpath("schema", dialect)
    steps = []
    for entry in folder.iterdir():
        match = _STEP_NAME.fullmatch(entry.name)
        if match:
            steps.append((int(match[1]), entry.name, entry.read_text(encoding="utf-8")))
    return sorted(steps)
