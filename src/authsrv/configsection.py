"""
Strict reading of one TOML table.

The server config and every plugin's own section go through L{Section}, so
that every mistake is reported the same way: one line naming the dotted key
and what is wrong with it (docs/design.md, Versioning).
"""

from __future__ import annotations

import builtins
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable, Literal, overload

from twisted.logger import Logger

_REQUIRED: Any = object()
log = Logger()

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_DURATION_UNITS = (86400, 3600, 60, 1)
MAX_INT = 2**31 - 1
"""
The largest integer any key takes: every count and size is far below it,
and a mistyped huge one is an error here, not an overflow deep in the store.
"""
MAX_DURATION = 3650 * 86400
"""
Ten years: longer than any lifetime or timeout wants, and short enough that
now plus it stays a date and fits the store's 64-bit integers.
"""


class ConfigError(Exception):
    """
    A config mistake: C{key} is the dotted path, C{problem} says what is wrong.
    """

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


class Unreachable(ConfigError):
    """
    The section is usable, but the server it names (a database, a
    directory) cannot be reached now: worth trying again, unlike a mistake.
    """


def parse_duration(value: str) -> int:
    """
    Seconds in a duration such as C{"90d"}, C{"1h30m"} or C{"45s"}; raises
    L{ValueError} otherwise.
    """
    match = _DURATION.match(value.strip())
    if not value.strip() or match is None:
        raise ValueError(value)
    return sum(int(n) * unit for n, unit in zip(match.groups(), _DURATION_UNITS) if n)


def _typename(value: object) -> str:
    return {
        str: "a string",
        int: "an integer",
        bool: "a boolean",
        float: "a number",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


class Section:
    """
    A TOML table being read: each getter pops its key, and L{done} reports
    whatever is left as an unknown key.
    """

    def __init__(self, data: dict, path: str, base_dir: Path):
        if not isinstance(data, dict):
            raise ConfigError(path, f"must be a table, not {_typename(data)}")
        self._data = dict(data)
        self.path = path
        self.base_dir = base_dir

    def key(self, name: str) -> str:
        """The dotted path of C{name} inside this section."""
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, problem: str) -> ConfigError:
        return ConfigError(self.key(name), problem)

    def has(self, name: str) -> bool:
        return name in self._data

    def _get(self, name: str, default: Any, kind: type | tuple, what: str) -> Any:
        if name not in self._data:
            if default is _REQUIRED:
                raise self.error(name, "is required")
            return default
        value = self._data.pop(name)
        if isinstance(value, bool) and kind is not bool and kind != (bool,):
            raise self.error(name, f"must be {what}, not a boolean")
        if not isinstance(value, kind):
            raise self.error(name, f"must be {what}, not {_typename(value)}")
        return value

    def str(self, name: str, default: Any = _REQUIRED, *, choices=None) -> Any:
        value = self._get(name, default, str, "a string")
        if value is default:
            return value
        if not value.strip():
            raise self.error(name, "must not be empty")
        if choices is not None and value not in choices:
            raise self.error(
                name, f"must be one of {', '.join(map(repr, choices))}, not {value!r}"
            )
        return value

    def int(self, name: builtins.str, default: Any = _REQUIRED, *, minimum: int | None = None,
            maximum: int = MAX_INT) -> Any:
        """An integer between C{minimum} and C{maximum}: L{MAX_INT} unless the key has a lower ceiling."""
        value = self._get(name, default, int, "an integer")
        if value is not default and minimum is not None and value < minimum:
            raise self.error(name, f"must be at least {minimum}, not {value}")
        if value is not default and value > maximum:
            raise self.error(name, f"must be at most {maximum}, not {value}")
        return value

    def bool(self, name: builtins.str, default: Any = _REQUIRED) -> Any:
        return self._get(name, default, bool, "true or false")

    def str_list(self, name: builtins.str, default: Any = _REQUIRED) -> Any:
        """A list of non-empty strings; a single string is taken as a list of one."""
        if isinstance(self._data.get(name), str):
            return [self.str(name)]
        value = self._get(name, default, list, "an array of strings")
        if value is default:
            return value
        for index, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                raise ConfigError(
                    f"{self.key(name)}[{index}]",
                    f"must be a non-empty string, not {_typename(item)}"
                    if not isinstance(item, str)
                    else "must not be empty",
                )
        return value

    def duration(self, name: builtins.str, default: Any = _REQUIRED, *, maximum: builtins.int = MAX_DURATION) -> Any:
        """
        Seconds, given as an integer or a string such as C{"30d"} or
        C{"1h"}, at most C{maximum}: L{MAX_DURATION} unless the key has a
        lower ceiling.
        """
        value = self._get(name, default, (int, str), 'a duration such as "90s", "15m", "1h" or "30d"')
        if value is default:
            return value
        if isinstance(value, str):
            try:
                value = parse_duration(value)
            except ValueError:
                raise self.error(
                    name, f'must be a duration such as "90s", "15m", "1h" or "30d", not {value!r}'
                ) from None
        if value < 0:
            raise self.error(name, "must not be negative")
        if value > maximum:
            most = f"{maximum // 86400}d" if maximum % 86400 == 0 else f"{maximum}s"
            raise self.error(name, f"must be at most {most}, not {value}s")
        return value

    def path_(self, name: builtins.str, default: Any = _REQUIRED) -> Any:
        """
        A filesystem path (the default too), relative ones taken from the
        config file's folder.
        """
        value = self.str(name, default)
        if value is None:
            return None
        if "\x00" in value:
            raise self.error(name, "must not contain a NUL character")
        try:
            expanded = Path(value).expanduser()
        except RuntimeError:
            raise self.error(name, f"{value!r} names the home folder of an unknown user") from None
        return (self.base_dir / expanded).resolve()

    def table(self, name: builtins.str, default: Any = _REQUIRED) -> Any:
        """A nested L{Section}."""
        value = self._get(name, default, dict, "a table")
        if value is default:
            return value
        return Section(value, self.key(name), self.base_dir)

    def tables(self, name: builtins.str) -> list["Section"]:
        """An array of tables (C{[[name]]}), each a L{Section}."""
        value = self._get(name, [], list, "an array of tables")
        sections = []
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise ConfigError(f"{self.key(name)}[{index}]", f"must be a table, not {_typename(item)}")
            sections.append(Section(item, f"{self.key(name)}[{index}]", self.base_dir))
        return sections

    @overload
    def secret(
        self,
        name: builtins.str,
        *,
        required: Literal[True] = True,
        environ: Callable = os.environ.get,
    ) -> builtins.str: ...

    @overload
    def secret(
        self,
        name: builtins.str,
        *,
        required: builtins.bool,
        environ: Callable = os.environ.get,
    ) -> builtins.str | None: ...

    def secret(
        self,
        name: builtins.str,
        *,
        required: builtins.bool = True,
        environ: Callable = os.environ.get,
    ) -> builtins.str | None:
        """
        A secret, read from an environment variable (C{NAME_env}) or a file
        (C{NAME_file}); never from the config file itself, never from the
        command line.
        """
        if name in self._data:
            del self._data[name]
            raise self.error(
                name,
                f"secrets are not written in the config file; use {name}_env"
                f" (an environment variable) or {name}_file (a file)",
            )
        env_key, file_key = f"{name}_env", f"{name}_file"
        if self.has(env_key) and self.has(file_key):
            del self._data[env_key], self._data[file_key]
            raise self.error(env_key, f"give either {env_key} or {file_key}, not both")
        if self.has(env_key):
            variable = self.str(env_key)
            value = environ(variable)
            if not value:
                raise self.error(env_key, f"environment variable {variable} is not set or empty")
            return value
        if self.has(file_key):
            path = self.path_(file_key)
            try:
                value = self._secret_file(file_key, path).strip()
            except OSError as e:
                raise self.error(file_key, f"cannot read {path}: {e.strerror}") from None
            except UnicodeDecodeError:
                raise self.error(file_key, f"{path} is not UTF-8 text") from None
            if not value:
                raise self.error(file_key, f"{path} is empty")
            return value
        if required:
            raise self.error(env_key, f"is required (or {file_key})")
        return None

    def secret_source(self, name: builtins.str) -> builtins.str:
        """
        The key that gives the secret C{name}: C{NAME_file}, else
        C{NAME_env} (the one named when neither is given); asked before
        L{secret} takes it, to name the key a refused value came from.
        """
        return f"{name}_file" if self.has(f"{name}_file") else f"{name}_env"

    def _secret_file(self, file_key: builtins.str, path: Path) -> builtins.str:
        """
        The text of a secret file, with a warning when every user of the
        machine may read it: a group-readable file (0640) is a common
        deployment, a world-readable one is a leak waiting to happen. A
        byte order mark is no part of the secret, which nobody else would have.
        """
        with open(path, "rb") as file:
            mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
            data = file.read()
        if mode & stat.S_IROTH:
            log.warn("{key}: {path} is readable by every user of this machine (mode {mode:04o}); chmod 600 it",
                     key=self.key(file_key), path=str(path), mode=mode)
        return data.decode("utf-8-sig")

    def rest(self) -> dict:
        """Take every remaining key (a plugin's own section)."""
        data, self._data = self._data, {}
        return data

    def done(self) -> None:
        """Raise for the keys nobody asked for: one error, at the first, naming every one."""
        names = list(self._data)
        if names:
            also = f" (also unknown: {', '.join(map(self.key, names[1:]))})" if len(names) > 1 else ""
            raise self.error(names[0], unknown(self._data[names[0]]) + also)


def unknown(value) -> str:
    """What a key nobody asked for is: a misspelt C{[section]} or C{[[section]]} reads as one."""
    tables = isinstance(value, dict) or (isinstance(value, list) and bool(value) and isinstance(value[0], dict))
    return "unknown section" if tables else "unknown key"


class Problems:
    """
    The mistakes found so far in one file: reading goes on after each, with
    a stand-in value, so that one look at the file reports them all.
    Sections read outside L{authsrv.config} (C{[chat]}, C{[remote_documents]})
    take it too.
    """

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    def take(self, read, *args, fallback=None, **kwargs):
        """C{read(*args, **kwargs)}, or C{fallback} after noting its L{ConfigError}."""
        try:
            return read(*args, **kwargs)
        except ConfigError as e:
            self.errors.append(e)
            return fallback

    def add(self, error: ConfigError) -> None:
        self.errors.append(error)

    def done(self, section: Section) -> None:
        """Note every key of C{section} that nobody asked for."""
        for name, value in section.rest().items():
            self.errors.append(section.error(name, unknown(value)))
