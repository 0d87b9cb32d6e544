"""
The docs that ship with the code: the README's configuration reference names
every key the config reader asks for and parses as a config file; citations
of the product decisions point at docs/design.md and at sections it has; the
SQLite backup and restore that docs/operations.md prescribes round-trips a
real store; the OpenAPI description's client authentication enums are the
code's.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tomllib
from types import SimpleNamespace

import pytest
import pytest_twisted
from prometheus_client.metrics import MetricWrapperBase

from authsrv.admin.main import _parser, _subcommands
from authsrv.config import parse_config
from authsrv.metrics import Metrics
from authsrv.plugins import factories
from authsrv.configsection import Section
from authsrv.flows.registration import REGISTRABLE_METHODS
from authsrv.operations.clientspec import EDITABLE
from authsrv.operations.views import client_view
from authsrv.protocol.client_assertion import ASSERTION_ALGS, HMAC_ALGS
from authsrv.protocol.clientauth import AUTH_METHODS
from authsrv.records import Client

from conftest import ROOT, admin

README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"
OPERATIONS = ROOT / "docs" / "operations.md"
OPENAPI = ROOT / "src" / "authsrv" / "openapi.json"
COMMENTED_KEY = re.compile(r"^# (\w+ = )", re.M)
OLD_NAME = "DESIGN" ".md"
CHAT_KEY = base64.urlsafe_b64encode(bytes(range(32))).decode().rstrip("=")


def reference_block() -> str:
    """The README's configuration reference: its first TOML block, commented-out keys included."""
    text = README.read_text().split("## Configuration reference", 1)[1]
    block = re.search(r"```toml\n(.*?)```", text, re.S).group(1)
    return COMMENTED_KEY.sub(r"\1", block)


def dotted_keys(data: dict, prefix: str = "") -> set[str]:
    """Every key of a TOML document as a dotted path, arrays of tables as their name."""
    keys = set()
    for name, value in data.items():
        path = prefix + name
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            value = {k: v for item in value for k, v in item.items()}
        if isinstance(value, dict):
            keys |= dotted_keys(value, path + ".")
        else:
            keys.add(path)
    return keys


STRONG_SECRET = "kX3vQ9-pL2mN7rT4wY8zB1cD6fG0hJ5s"
"""A secret strong enough for an https public URL (the reference's)."""


def with_secrets_from_env(data: dict, monkeypatch) -> dict:
    """The reference with each C{X_file} secret read from a variable instead (its files exist only there)."""
    if isinstance(data, list):
        return [with_secrets_from_env(item, monkeypatch) for item in data]
    if not isinstance(data, dict):
        return data
    result = {}
    for name, value in data.items():
        if name.endswith("_file") and isinstance(value, str):
            variable = f"AUTHSRV_DOCS_{len(os.environ)}_{name.upper()}"
            monkeypatch.setenv(variable, CHAT_KEY if name == "encryption_key_file" else STRONG_SECRET + variable)
            result[name[: -len("_file")] + "_env"] = variable
        else:
            result[name] = with_secrets_from_env(value, monkeypatch)
    return result


def keys_asked(document: dict, monkeypatch, tmp_path) -> set[str]:
    """The dotted keys the config reader asks for while reading C{document}, whether given or not."""
    asked: set[str] = set()
    get, has = Section._get, Section.has

    def recording_get(self, name, *args, **kwargs):
        asked.add(re.sub(r"\[\d+\]", "", self.key(name)))
        return get(self, name, *args, **kwargs)

    def recording_has(self, name):
        asked.add(re.sub(r"\[\d+\]", "", self.key(name)))
        return has(self, name)

    monkeypatch.setattr(Section, "_get", recording_get)
    monkeypatch.setattr(Section, "has", recording_has)
    parse_config(document, tmp_path / "authsrv.toml")
    return asked


def test_reference_parses_and_names_every_key(monkeypatch, tmp_path):
    reference = tomllib.loads(reference_block())
    documented = dotted_keys(reference)
    asked = keys_asked(with_secrets_from_env(reference, monkeypatch), monkeypatch, tmp_path)
    tables = {key.rsplit(".", 1)[0] for key in documented if "." in key} | {"limits.parameters"}

    def documented_secret(key: str) -> bool:
        base = key.removesuffix("_env").removesuffix("_file")
        return base != key and bool({base + "_env", base + "_file"} & documented)

    undocumented = {key for key in asked - tables - documented if not documented_secret(key)}
    assert not undocumented, f"keys the config reader asks for, missing from the README's reference: {undocumented}"


PLUGIN_SECTIONS = {
    ("identity", "ldap"): [{"urls": ["ldap://ldap.invalid"], "user_base_dn": "dc=example"}],
    ("identity", "postgres"): [{"dsn": "host=db.invalid"}, {
        "dsn": "host=db.invalid", "mode": "mapped", "user_by_login": "SELECT 1", "user_by_id": "SELECT 1"}],
    ("store", "postgres"): [{"dsn": "host=db.invalid"}],
    ("keystore", "postgres"): [{"dsn": "host=db.invalid"}],
}
"""The least each plugin section needs for its reader to ask for every key it knows."""


def test_every_plugin_key_is_in_the_readme(monkeypatch, tmp_path):
    """The keys each store, keystore and identity plugin reads appear in the README's TOML examples."""
    documented = set(re.findall(r"\w+", " ".join(re.findall(r"```toml\n(.*?)```", README.read_text(), re.S))))
    asked: set[tuple[str, str]] = set()
    get, has = Section._get, Section.has
    monkeypatch.setattr(Section, "_get", lambda self, name, *a, **k: asked.add((self.path, name)) or get(
        self, name, *a, **k))
    monkeypatch.setattr(Section, "has", lambda self, name: asked.add((self.path, name)) or has(self, name))
    context = SimpleNamespace(check_only=True, link_provider=None, reactor=None)
    for role in ("identity", "store", "keystore"):
        for name, factory in factories(role).items():
            for data in PLUGIN_SECTIONS.get((role, name), [{}]):
                try:
                    factory.from_config(Section(dict(data), f"{role}:{name}", tmp_path), context)
                except Exception:
                    pass  # every key is read before a file or a server is used, which fails here
    secrets = {name.removesuffix(suffix) for name in documented for suffix in ("_env", "_file")
               if name.endswith(suffix)}
    missing = {name for _, name in asked if name not in documented
               and name.removesuffix("_env").removesuffix("_file") not in secrets}
    assert not missing, f"plugin keys missing from the README's examples: {missing}"
    assert {path for path, _ in asked} >= {f"{role}:{name}" for role in ("identity", "store", "keystore")
                                          for name in factories(role)}


def _set_variables(data, monkeypatch) -> None:
    """Set each variable an C{X_env} key of C{data} names, as the operator would."""
    if isinstance(data, list):
        for item in data:
            _set_variables(item, monkeypatch)
    elif isinstance(data, dict):
        for name, value in data.items():
            if name.endswith("_env") and isinstance(value, str):
                monkeypatch.setenv(value, CHAT_KEY if "encryption_key" in name else STRONG_SECRET + value)
            else:
                _set_variables(value, monkeypatch)


@pytest.mark.parametrize("path", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_config_example_is_a_valid_config(path, monkeypatch, tmp_path):
    """Each TOML example of the docs, but the users file's, read as the server reads its config file."""
    for block in re.findall(r"```toml\n(.*?)```", path.read_text(), re.S):
        document = tomllib.loads(block)
        if "users" in document:
            continue
        _set_variables(document, monkeypatch)
        parse_config(with_secrets_from_env(document, monkeypatch), tmp_path / "authsrv.toml")


def test_design_citations_point_at_sections_it_has():
    design = DESIGN.read_text()
    names = re.findall(r"^- \*\*([^*:]+?):?\*\*", design, re.M) + re.findall(r"^## (.+)$", design, re.M)
    sections = {name.split(" (")[0] for name in names}
    cited = set()
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), README, ROOT / "SECURITY.md",
                 *(ROOT / "docs").glob("*.md"), *(ROOT / "bench").glob("*.*")]:
        text = " ".join(path.read_text().split())
        assert OLD_NAME not in text, f"{path.relative_to(ROOT)} cites {OLD_NAME}, which is not in the repository"
        cited |= {m.strip() for m in re.findall(r"docs/design\.md,? ([A-Z][A-Za-z]+(?: [a-z]+)*)", text)}
    assert cited, "no citation found: the pattern no longer matches how the code cites docs/design.md"
    assert not cited - sections, f"cited sections that docs/design.md lacks: {cited - sections}"


def test_openapi_auth_method_and_algorithm_enums_are_the_code_constants():
    document = json.loads(OPENAPI.read_text())
    schemas = document["components"]["schemas"]
    paths = document["paths"]
    bodies = [paths["/api/auth/oauth2/register"]["post"], paths["/api/auth/oauth2/register/{client_id}"]["put"]]
    registrable = [body["requestBody"]["content"]["application/json"]["schema"]["properties"] for body in bodies]
    for properties in (*registrable, schemas["RegisteredClient"]["properties"]):
        assert properties["token_endpoint_auth_method"]["enum"] == list(REGISTRABLE_METHODS)
    for name in ("AdminClientSettings", "AdminNewClient", "AdminClient"):
        assert schemas[name]["properties"]["token_endpoint_auth_method"]["enum"] == [*AUTH_METHODS, None]
    discovery = schemas["AuthorizationServerMetadata"]["properties"]
    for endpoint in ("token_endpoint", "revocation_endpoint", "introspection_endpoint"):
        methods = [m for m in AUTH_METHODS if m != "none" or endpoint != "introspection_endpoint"]
        assert discovery[f"{endpoint}_auth_methods_supported"]["items"]["enum"] == methods
        assert discovery[f"{endpoint}_auth_signing_alg_values_supported"]["items"]["enum"] == [
            *ASSERTION_ALGS, *HMAC_ALGS]


def test_openapi_admin_client_schemas_are_the_fields_the_api_takes_and_answers():
    schemas = json.loads(OPENAPI.read_text())["components"]["schemas"]
    assert set(schemas["AdminClientSettings"]["properties"]) == set(EDITABLE)
    assert set(schemas["AdminNewClient"]["properties"]) == {*EDITABLE, "client_id", "public"}
    answered = client_view(Client("app", None, ["https://app.example/cb"]))
    assert set(schemas["AdminClient"]["properties"]) == set(answered)


def test_the_operator_command_synopsis_names_every_option():
    """The README's synopsis of authsrv-admin: every command and option it has (a --no- form goes with its flag)."""
    text = README.read_text().split("## The operator command", 1)[1].split("\n## ", 1)[0]
    synopsis = text.split("\n\n", 2)[1]
    missing = set()
    for command in _subcommands(_parser()):
        name = command.prog.removeprefix("authsrv-admin ")
        if not re.search(rf"\b{re.escape(name.split()[-1])}\b", synopsis):
            missing.add(name)
        for action in command._actions:
            for option in action.option_strings:
                if option.startswith("--") and not option.startswith("--no-") and option not in (
                        "--help", "--config", "--json") and not re.search(rf"{re.escape(option)}(?![\w-])", synopsis):
                    missing.add(f"{name} {option}")
    assert not missing, f"missing from the README's synopsis of authsrv-admin: {sorted(missing)}"


def _commands(parser) -> dict:
    """Each subcommand's name, with the names below it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {name: _commands(sub) for name, sub in action.choices.items()}
    return {}


def test_every_operator_command_the_docs_name_exists():
    commands = _commands(_parser())
    wrong = set()
    for path in [README, ROOT / "SECURITY.md", *(ROOT / "docs").glob("*.md")]:
        text = path.read_text()
        code = re.findall(r"`([^`\n]+)`", text) + re.findall(r"^    ([^#\n]+)", text, re.M)
        for words in re.findall(r"authsrv-admin((?: --?[a-z-]+(?: [A-Za-z./-]+\.toml)?)*(?: [a-z][a-z-]*)+)",
                                "\n".join(code)):
            names = [word for word in words.split() if not word.startswith("-") and not word.endswith(".toml")]
            known = commands
            for name in names:
                if not known:
                    break
                if name not in known:
                    wrong.add(f"{path.name}: authsrv-admin{words}")
                    break
                known = known[name]
    assert not wrong, f"commands the docs name that authsrv-admin does not have: {sorted(wrong)}"


class _ActiveKey:
    """A keystore with one active key, for the key age gauge."""

    def keys(self):
        return [type("Key", (), {"state": "active", "activated_at": 0, "alg": "RS256"})()]


def test_every_metric_is_in_the_readme_with_its_labels():
    metrics = Metrics()
    metrics.watch_keys(_ActiveKey(), type("Clock", (), {"seconds": staticmethod(lambda: 10)})())
    table = README.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows = {name: labels for name, labels in re.findall(r"^\| `(authsrv_\w+)` \| ([^|]*)\|", table, re.M)}
    exposed = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            suffix = "_total" if metric._type == "counter" else ""
            exposed[metric._name + suffix] = set(metric._labelnames)
    for family in metrics.registry.collect():
        if family.name.startswith("authsrv_") and family.type == "gauge":
            exposed[family.name] = {key for sample in family.samples for key in sample.labels}
    assert set(rows) == set(exposed), f"metrics missing from the README: {set(exposed) - set(rows)}; " \
        f"documented but not exposed: {set(rows) - set(exposed)}"
    for name, labels in exposed.items():
        assert set(re.findall(r"`(\w+)`", rows[name])) == labels, name


def test_operations_links_exist():
    for target in re.findall(r"\]\(\.\./([^)#]+)\)", OPERATIONS.read_text()):
        assert (ROOT / target).exists(), target


def python_backup(source, target) -> None:
    """The Python one-liner docs/operations.md gives, run as written."""
    command = re.search(r"python3 -c '(.*?)' \\\n", OPERATIONS.read_text()).group(1)
    subprocess.run([sys.executable, "-c", command, str(source), str(target)], check=True, timeout=30)


def sqlite_cli_backup(source, target) -> None:
    subprocess.run(["sqlite3", str(source), f".backup {target}"], check=True, timeout=30)


BACKUPS = [python_backup]
if shutil.which("sqlite3"):
    BACKUPS.append(sqlite_cli_backup)


@pytest.mark.parametrize("backup", BACKUPS, ids=lambda f: f.__name__)
@pytest_twisted.ensureDeferred
async def test_sqlite_backup_and_restore_round_trip(tmp_path, backup):
    (tmp_path / "users.toml").write_text("")
    config = tmp_path / "authsrv.toml"
    config.write_text('[store]\npath = "authsrv.sqlite3"\n')
    database = tmp_path / "authsrv.sqlite3"

    async def run(*args):
        done = await admin("--config", str(config), *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout

    await run("client", "add", "before", "--redirect-uri", "https://before.example/cb")
    saved = tmp_path / "backup.sqlite3"
    backup(database, saved)
    with sqlite3.connect(saved) as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    await run("client", "add", "after", "--redirect-uri", "https://after.example/cb")

    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"authsrv.sqlite3{suffix}").unlink(missing_ok=True)
    shutil.copyfile(saved, database)
    listed = await run("client", "list")
    assert [line.split("\t")[0] for line in listed.splitlines()] == ["before"]
