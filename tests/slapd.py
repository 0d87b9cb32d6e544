"""
A private OpenLDAP server for the tests: Debian's slapd with a config,
schema, TLS certificates and data of its own in a temporary folder, on free
ports of 127.0.0.1, loaded from tests/ldap/*.ldif with slapadd before it
starts. Never a directory that merely happens to run on the machine.

The conformance suite's users (L{authsrv.testing.identity.seed_users}) are
written at start and again by L{Slapd.seed}: the sub in employeeNumber
(entryUUID cannot hold the suite's values), the disabled flag in
nsAccountLock with the reason in description, and claims in attributes of
the tests' own schema below.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from ipaddress import IPv4Address
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from ldap3 import BASE, MODIFY_REPLACE, Connection, Server
from ldap3.utils.dn import escape_rdn

from conftest import free_port

from authsrv.testing.identity import seed_users

SLAPD = "/usr/sbin/slapd"
SLAPADD = "/usr/sbin/slapadd"
LDIF = Path(__file__).parent / "ldap"
SCHEMA = Path("/etc/ldap/schema")

SUFFIX = "dc=example,dc=org"
ROOT_DN = f"cn=admin,{SUFFIX}"
ROOT_PASSWORD = "root-secret"
SERVICE_DN = f"cn=authsrv,ou=services,{SUFFIX}"
SERVICE_PASSWORD = "service-password"
SERVICE_SIZE_LIMIT = 30
"""The most entries one search answers the service account, as a directory's size limit does."""
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
CORP_USERS = f"ou=users,ou=corp,{SUFFIX}"
CORP_GROUPS = f"ou=groups,ou=corp,{SUFFIX}"

# Attributes the tests need that no stock OpenLDAP schema has: 389/FreeIPA's
# nsAccountLock, two claims, and Active Directory's account attributes with
# AD's OIDs (Debian's msuser.schema has them without matching rules, so they
# could not be searched).
_TEST_SCHEMA = """
attributetype ( 2.16.840.1.113730.3.1.610 NAME 'nsAccountLock'
    EQUALITY caseIgnoreMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 SINGLE-VALUE )
attributetype ( 1.3.6.1.4.1.32473.7.1.1 NAME 'authsrvEmailVerified'
    EQUALITY booleanMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.7 SINGLE-VALUE )
attributetype ( 1.3.6.1.4.1.32473.7.1.2 NAME 'authsrvChatUserId'
    EQUALITY caseExactMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 SINGLE-VALUE )
attributetype ( 1.2.840.113556.1.4.221 NAME 'sAMAccountName'
    EQUALITY caseIgnoreMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 SINGLE-VALUE )
attributetype ( 1.2.840.113556.1.4.2 NAME 'objectGUID'
    EQUALITY octetStringMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.40 SINGLE-VALUE )
attributetype ( 1.2.840.113556.1.4.8 NAME 'userAccountControl'
    EQUALITY integerMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.27 SINGLE-VALUE )
attributetype ( 1.2.840.113556.1.2.102 NAME 'memberOf'
    EQUALITY distinguishedNameMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.12 )
objectclass ( 1.3.6.1.4.1.32473.7.2.1 NAME 'authsrvTestAccount' AUXILIARY
    MAY ( nsAccountLock $ authsrvEmailVerified $ authsrvChatUserId ) )
objectclass ( 1.3.6.1.4.1.32473.7.2.2 NAME 'authsrvTestDirectoryObject' AUXILIARY
    MAY ( sAMAccountName $ objectGUID $ userAccountControl $ memberOf $ displayName ) )
"""

_CONFIG = """\
include {schema}/core.schema
include {schema}/cosine.schema
include {schema}/inetorgperson.schema
{test_schema}
pidfile {folder}/slapd.pid
argsfile {folder}/slapd.args
modulepath /usr/lib/ldap
moduleload back_mdb
moduleload ppolicy

TLSCACertificateFile {folder}/ca.pem
TLSCertificateFile {folder}/server.pem
TLSCertificateKeyFile {folder}/server.key

database mdb
suffix "{suffix}"
rootdn "{root_dn}"
rootpw {root_password}
directory {folder}/db
maxsize 33554432
dbnosync
index uid,employeeNumber,sAMAccountName eq
index member,uniqueMember,memberOf eq
limits dn.exact="{service_dn}" size={service_size_limit}

access to attrs=userPassword
    by self write
    by anonymous auth
    by * none
access to *
    by * read

overlay ppolicy
ppolicy_default "cn=default,ou=policies,{suffix}"
"""


def ssha(password: str) -> str:
    """An RFC 2307 {SSHA} hash, as slappasswd makes."""
    salt = os.urandom(8)
    digest = hashlib.sha1(password.encode("utf-8") + salt).digest()
    return "{SSHA}" + base64.b64encode(digest + salt).decode()


def _certificate(subject: str, key, issuer_name, issuer_key, *, ca: bool, names=()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def make_tls_files(folder: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and localhost signed by it, and an unrelated CA."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("authsrv test CA", ca_key, None, None, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate(
        "127.0.0.1", key, ca.subject, ca_key, ca=False,
        names=[x509.IPAddress(IPv4Address("127.0.0.1")), x509.DNSName("localhost")],
    )
    other_key = ec.generate_private_key(ec.SECP256R1())
    (folder / "ca.pem").write_bytes(_pem(ca))
    (folder / "other-ca.pem").write_bytes(_pem(_certificate("another CA", other_key, None, None, ca=True)))
    (folder / "server.pem").write_bytes(_pem(server))
    (folder / "server.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))
    os.chmod(folder / "server.key", 0o600)


def user_dn(login: str) -> str:
    return f"uid={escape_rdn(login)},{PEOPLE}"


def user_attributes(user, password: str) -> dict:
    """The entry of a seeded L{authsrv.records.User}."""
    attributes = {
        "objectClass": ["inetOrgPerson", "authsrvTestAccount"],
        "uid": user.login,
        "cn": user.login,
        "sn": user.login,
        "employeeNumber": user.sub,
        "userPassword": ssha(password),
        "authsrvEmailVerified": "TRUE" if user.email_verified else "FALSE",
    }
    optional = {
        "displayName": user.name,
        "mail": user.email,
        "labeledURI": user.picture,
        "authsrvChatUserId": user.chat_user_id,
        "nsAccountLock": "TRUE" if user.disabled else None,
        "description": user.disabled_reason,
    }
    attributes.update({k: v for k, v in optional.items() if v is not None})
    return attributes


class Slapd:
    """A running slapd; L{stop} and L{start} it for outage tests."""

    def __init__(self):
        for program in (SLAPD, SLAPADD):
            if not os.access(program, os.X_OK):
                raise RuntimeError(
                    f"{program} not found: the LDAP tests need Debian's slapd and ldap-utils"
                    " packages (scripts/test.sh installs them)"
                )
        self.folder = Path(tempfile.mkdtemp(prefix="authsrv-slapd-"))
        self.port, self.ldaps_port = free_port(), free_port()
        self.url = f"ldap://127.0.0.1:{self.port}"
        self.ldaps_url = f"ldaps://127.0.0.1:{self.ldaps_port}"
        self.ca_file = self.folder / "ca.pem"
        self.other_ca_file = self.folder / "other-ca.pem"
        self.service_password_file = self.folder / "bind-password"
        self.service_password_file.write_text(SERVICE_PASSWORD + "\n")
        self.service_password_file.chmod(0o600)
        self.process: subprocess.Popen | None = None
        (self.folder / "db").mkdir()
        make_tls_files(self.folder)
        self.config = self.folder / "slapd.conf"
        self.config.write_text(_CONFIG.format(
            schema=SCHEMA, test_schema=_TEST_SCHEMA, folder=self.folder, suffix=SUFFIX,
            root_dn=ROOT_DN, root_password=ROOT_PASSWORD, service_dn=SERVICE_DN,
            service_size_limit=SERVICE_SIZE_LIMIT,
        ))
        for ldif in sorted(LDIF.glob("*.ldif"), key=lambda p: p.name != "directory.ldif"):
            self._run(SLAPADD, "-q", "-f", str(self.config), "-l", str(ldif))
        self.start()
        self.seed(seed_users())

    def _run(self, *command: str) -> None:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")

    def start(self, timeout: float = 10.0) -> None:
        """Start slapd (again, after L{stop}) and wait until it accepts connections."""
        log = open(self.folder / "slapd.log", "ab")
        self.process = subprocess.Popen(
            [SLAPD, "-d", "0", "-f", str(self.config), "-h", f"{self.url}/ {self.ldaps_url}/"],
            stdout=log, stderr=log, cwd=self.folder,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"slapd exited {self.process.returncode}:\n{(self.folder / 'slapd.log').read_text()}"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.005)
        raise RuntimeError("slapd did not accept connections in time")

    def stop(self) -> None:
        """Stop slapd; its data stays for the next L{start}."""
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def pause(self, timeout: float = 10.0) -> None:
        """
        Freeze slapd (SIGSTOP): connections are accepted by the kernel and
        never answered. Returns once every thread has stopped: the kernel
        stops them one by one as each is scheduled, and under load a thread
        still running could answer a request sent after the signal.
        """
        self.process.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while not self._stopped():
            if time.monotonic() > deadline:
                raise RuntimeError("slapd did not stop on SIGSTOP in time")
            time.sleep(0.001)

    def _stopped(self) -> bool:
        """Whether every thread of slapd is stopped (state T in /proc)."""
        states = []
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except FileNotFoundError:
                continue
            states.append(stat.rsplit(")", 1)[1].split()[0])
        return all(state == "T" for state in states)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def admin(self) -> Connection:
        """A connection bound as the directory's root, for changing entries in tests."""
        return Connection(Server(self.url), ROOT_DN, ROOT_PASSWORD, auto_bind=True)

    @staticmethod
    def _done(connection: Connection, ok: bool, *allowed: int) -> None:
        if not ok and connection.result["result"] not in allowed:
            raise RuntimeError(f"directory change refused: {connection.result}")

    def put(self, dn: str, attributes: dict) -> None:
        """Add an entry, replacing one of the same DN."""
        with self.admin() as connection:
            self._done(connection, connection.delete(dn), 32)
            self._done(connection, connection.add(dn, attributes=attributes))

    def modify(self, dn: str, **replacements) -> None:
        """Replace attributes of an entry; an empty list removes one."""
        with self.admin() as connection:
            changes = {k: [(MODIFY_REPLACE, v if isinstance(v, list) else [v])] for k, v in replacements.items()}
            self._done(connection, connection.modify(dn, changes))

    def operational(self, dn: str, name: str) -> list:
        """The values of an entry's operational attribute C{name} (the password policy's state, say)."""
        with self.admin() as connection:
            connection.search(dn, "(objectClass=*)", BASE, attributes=[name])
            return list(connection.entries[0][name].values) if connection.entries and name in connection.entries[0] else []

    def delete(self, dn: str) -> None:
        """Delete an entry if it exists."""
        with self.admin() as connection:
            self._done(connection, connection.delete(dn), 32)

    def seed(self, users) -> None:
        """Write the conformance suite's users as they are given, replacing earlier versions."""
        for user, password in users:
            self.put(user_dn(user.login), user_attributes(user, password))

    def backend_config(self, **overrides) -> dict:
        """An LDAP backend section for the seeded users, over StartTLS with the service account."""
        config = {
            "urls": [self.url],
            "start_tls": True,
            "ca_file": str(self.ca_file),
            "bind_dn": SERVICE_DN,
            "bind_password_file": str(self.service_password_file),
            "user_base_dn": PEOPLE,
            "user_filter": "(&(objectClass=inetOrgPerson)(uid={login}))",
            "subject_attribute": "employeeNumber",
            "name_attribute": "displayName",
            "picture_attribute": "labeledURI",
            "chat_user_id_attribute": "authsrvChatUserId",
            "email_verified": "attribute",
            "email_verified_attribute": "authsrvEmailVerified",
            "disabled_reason_attribute": "description",
            "connect_timeout": 2,
            "bind_timeout": 2,
            "search_timeout": 2,
        }
        config.update(overrides)
        return {k: v for k, v in config.items() if v is not None}
