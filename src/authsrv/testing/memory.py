"""
A store in plain dictionaries, for fast tests of the HTTP layer (treq's
StubTreq) that need no database.

It answers every call with an already-fired L{Deferred} and keeps the SQLite
store's semantics, which the conformance suites check: lookups of tokens
carry the user's ban, refresh rotation knows grace-window replays and reuse,
revoking a grant revokes its whole family, and L{MemoryStore.gc} removes in
batches what expired. Every call runs to its end before the next starts, so
each atomic step is atomic. Two stores made on the same L{MemoryTables}
behave as two servers sharing one database.
"""

from __future__ import annotations

import secrets
from functools import wraps
from typing import NamedTuple

import attrs
from twisted.internet.defer import maybeDeferred, succeed
from zope.interface import implementer

from authsrv.interfaces import SERVER_KEY_BYTES, IStore
from authsrv.records import (
    DEVICE_APPROVED,
    DEVICE_PENDING,
    DEVICE_REDEEMED,
    LOGIN_STAGE,
    NOT_READ,
    POLL_REDEEMED,
    POLL_REUSED,
    POLL_UNKNOWN,
    RECOVERY_FACTOR,
    TOTP_FACTOR,
    AccessState,
    Consent,
    Factor,
    NotRevoked,
    RefreshNotFound,
    Replayed,
    Reused,
    RevokedAccess,
    RevokedRefresh,
    Rotated,
    ThrottleDecision,
    TotpFactor,
)
from authsrv.store import codes, device as devices, throttle
from authsrv.store.codes import CodeNotFound, CodeRedeemed, CodeReused
from authsrv.store.errors import AlreadyExists, AlreadyLinked


class LoginAttempt(NamedTuple):
    """A counted login attempt, as the SQL stores' C{login_attempts} rows."""

    account: str
    address: str
    at: int
    expires_at: int


@attrs.define
class MemoryTables:
    """
    The rows, keyed as the SQL stores' primary keys. A code's C{used_at}
    and an access token's C{revoked_at} are no fields of their records, so
    they are kept beside them.
    """

    clients: dict = attrs.Factory(dict)
    sessions: dict = attrs.Factory(dict)
    interactions: dict = attrs.Factory(dict)
    link_attempts: dict = attrs.Factory(dict)
    pushed: dict = attrs.Factory(dict)
    grants: dict = attrs.Factory(dict)
    codes: dict = attrs.Factory(dict)
    devices: dict = attrs.Factory(dict)
    """Device code hash -> L{authsrv.records.DeviceAuthorization}."""
    code_used_at: dict = attrs.Factory(dict)
    access: dict = attrs.Factory(dict)
    access_revoked_at: dict = attrs.Factory(dict)
    refresh: dict = attrs.Factory(dict)
    consents: dict = attrs.Factory(dict)
    bans: dict = attrs.Factory(dict)
    linked: dict = attrs.Factory(dict)
    link_locks: dict = attrs.Factory(dict)
    login_attempts: dict = attrs.Factory(dict)
    """Ticket -> L{LoginAttempt}."""
    last_ticket: int = 0
    """The latest ticket given: like the SQL stores' ids, none is given twice."""
    known_devices: dict = attrs.Factory(dict)
    """(account, device hash) -> expires_at."""
    server_keys: dict = attrs.Factory(dict)
    """Name -> the server key's bytes."""
    totp: dict = attrs.Factory(dict)
    """Sub -> L{TotpFactor}."""
    recovery_codes: dict = attrs.Factory(dict)
    """Sub -> (created_at, set of unused code hashes)."""
    mfa_demands: dict = attrs.Factory(dict)
    """Sub -> when a policy first asked the user to enrol."""
    passkeys: dict = attrs.Factory(dict)
    """Credential id -> L{Passkey}."""
    dpop_proofs: dict = attrs.Factory(dict)
    """Replay key (a DPoP proof's, an answered passkey challenge's) -> until when it is kept."""
    client_assertions: dict = attrs.Factory(dict)
    """(client_id, jti) -> expires_at."""


def _answered(method):
    """The method's result, or its exception, as an already-fired Deferred."""

    @wraps(method)
    def answer(self, *args, **kwargs):
        return maybeDeferred(method, self, *args, **kwargs)

    return answer


def _page(rows: list, after, limit, key) -> list:
    """The ordered C{rows} after C{after}, at most C{limit}, as a database's keyset page."""
    rows = [row for row in rows if after is None or key(row) > after]
    return rows if limit is None else rows[:limit]


def _insert(table: dict, key, value) -> None:
    if key in table:
        raise AlreadyExists(f"{key!r} exists already")
    table[key] = value


@implementer(IStore)
class MemoryStore:
    """L{IStore} in memory; C{tables} shares another store's rows."""

    def __init__(self, tables: MemoryTables | None = None):
        self.tables = MemoryTables() if tables is None else tables

    # IServerSecrets

    @_answered
    def server_key(self, name):
        return self.tables.server_keys.setdefault(name, secrets.token_bytes(SERVER_KEY_BYTES))

    # IClientRegistry

    @_answered
    def add_client(self, client):
        _insert(self.tables.clients, client.client_id, client)

    @_answered
    def put_client(self, client):
        self.tables.clients[client.client_id] = client

    @_answered
    def change_client(self, before, after):
        if self.tables.clients.get(before.client_id) != before:
            return False
        self.tables.clients[after.client_id] = after
        return True

    @_answered
    def get_client(self, client_id):
        return self.tables.clients.get(client_id)

    @_answered
    def list_clients(self, after=None, limit=None):
        return _page([self.tables.clients[key] for key in sorted(self.tables.clients)], after, limit,
                     lambda c: c.client_id)

    @_answered
    def list_clients_of(self, sources):
        return [self.tables.clients[key] for key in sorted(self.tables.clients)
                if self.tables.clients[key].source in sources]

    @_answered
    def count_clients(self, source):
        return sum(client.source == source for client in self.tables.clients.values())

    @_answered
    def remove_client(self, client_id, expected=None):
        tables = self.tables
        if expected is not None and tables.clients.get(client_id) != expected:
            return False
        grants = {key for key, grant in tables.grants.items() if grant.client_id == client_id}
        for table, marks in ((tables.codes, tables.code_used_at), (tables.access, tables.access_revoked_at),
                             (tables.refresh, {})):
            for key in [key for key, row in table.items() if row.grant_id in grants]:
                del table[key]
                marks.pop(key, None)
        for key in grants:
            del tables.grants[key]
        for key in [key for key in tables.consents if key[1] == client_id]:
            del tables.consents[key]
        return tables.clients.pop(client_id, None) is not None

    # IBrowserSessionStore

    @_answered
    def create_session(self, session):
        _insert(self.tables.sessions, session.session_hash, session)

    @_answered
    def get_session(self, session_hash, now):
        session = self.tables.sessions.get(session_hash)
        return session if session is not None and session.expires_at > now else None

    @_answered
    def end_session(self, session_hash):
        return self.tables.sessions.pop(session_hash, None)

    @_answered
    def list_user_sessions(self, sub, now, after=None, limit=None):
        live = [s for s in self.tables.sessions.values() if s.sub == sub and s.expires_at > now]
        return _page(sorted(live, key=lambda s: (s.created_at, s.sid)), after, limit, lambda s: (s.created_at, s.sid))

    @_answered
    def touch_session(self, session_hash, now):
        session = self.tables.sessions.get(session_hash)
        if session is not None:
            self.tables.sessions[session_hash] = attrs.evolve(session, last_seen=now)

    @_answered
    def end_user_sessions(self, sub):
        ended = [key for key, session in self.tables.sessions.items() if session.sub == sub]
        return [self.tables.sessions.pop(key) for key in ended]

    # IInteractionStore

    @_answered
    def save_interaction(self, interaction):
        _insert(self.tables.interactions, interaction.interaction_id, interaction)

    @_answered
    def save_login_interaction(self, interaction, cap):
        live = sorted(
            (other.expires_at for other in self.tables.interactions.values()
             if other.address == interaction.address and other.stage == LOGIN_STAGE
             and other.expires_at > interaction.created_at),
            reverse=True,
        )
        if len(live) >= cap:
            return live[cap - 1]
        _insert(self.tables.interactions, interaction.interaction_id, interaction)
        return None

    @_answered
    def get_interaction(self, interaction_id, now):
        interaction = self.tables.interactions.get(interaction_id)
        return interaction if interaction is not None and interaction.expires_at > now else None

    @_answered
    def take_interaction(self, interaction_id, stage):
        interaction = self.tables.interactions.get(interaction_id)
        if interaction is None or interaction.stage != stage:
            return False
        del self.tables.interactions[interaction_id]
        return True

    # ILinkAttemptStore

    @_answered
    def save_link_attempt(self, attempt):
        _insert(self.tables.link_attempts, attempt.state_hash, attempt)

    @_answered
    def take_link_attempt(self, state_hash, session_hash, now):
        attempt = self.tables.link_attempts.get(state_hash)
        if attempt is None or attempt.session_hash != session_hash or attempt.expires_at <= now:
            return None
        return self.tables.link_attempts.pop(state_hash)

    # IPushedRequestStore

    @_answered
    def save_pushed_request(self, pushed):
        _insert(self.tables.pushed, pushed.uri_hash, pushed)

    @_answered
    def take_pushed_request(self, uri_hash, client_id, now):
        pushed = self.tables.pushed.get(uri_hash)
        if pushed is None or pushed.client_id != client_id or pushed.expires_at <= now:
            return None
        return self.tables.pushed.pop(uri_hash)

    # IAuthorizationCodeStore

    @_answered
    def save_code(self, code, grant, stored_client=True):
        if grant.grant_id in self.tables.grants or code.code_hash in self.tables.codes:
            raise AlreadyExists(f"grant {grant.grant_id!r} or its code exists already")
        if stored_client and grant.client_id not in self.tables.clients:
            return False
        self.tables.grants[grant.grant_id] = grant
        self.tables.codes[code.code_hash] = code
        return True

    @_answered
    def find_code(self, code_hash, now, link_provider=None):
        code = self.tables.codes.get(code_hash)
        if code is None:
            return CodeNotFound()
        return codes.found(code, code_hash in self.tables.code_used_at, self.tables.grants[code.grant_id],
                           self.tables.bans.get(code.sub), now, self._linked_user_id(code.sub, link_provider))

    @_answered
    def redeem_code(self, code_hash, access, refresh, now):
        code = self.tables.codes.get(code_hash)
        if code is None:
            return CodeNotFound()
        if code_hash in self.tables.code_used_at:
            self._revoke_grant(code.grant_id, now)
            return CodeReused(code.grant_id)
        if code.expires_at <= now or not self._issuable(code.grant_id, now):
            return CodeNotFound()
        self._issue(access, refresh)
        self.tables.code_used_at[code_hash] = now
        return CodeRedeemed()

    @_answered
    def refuse_code(self, code_hash, now):
        code = self.tables.codes.get(code_hash)
        if code is not None:
            self.tables.code_used_at.setdefault(code_hash, now)
            self._revoke_grant(code.grant_id, now)

    # IDeviceAuthorizationStore

    @_answered
    def save_device_authorization(self, device):
        if any(d.user_code_hash == device.user_code_hash for d in self.tables.devices.values()):
            raise AlreadyExists("that user code exists already")
        _insert(self.tables.devices, device.device_code_hash, device)

    def _device_of_user_code(self, user_code_hash, now):
        for device in self.tables.devices.values():
            if device.user_code_hash == user_code_hash and device.expires_at > now:
                return device
        return None

    @_answered
    def find_device_authorization(self, user_code_hash, now):
        return self._device_of_user_code(user_code_hash, now)

    @_answered
    def decide_device_authorization(self, user_code_hash, sub, grant, now):
        device = self._device_of_user_code(user_code_hash, now)
        if device is None or device.status != DEVICE_PENDING or device.client_id not in self.tables.clients:
            return False
        if grant is not None:
            _insert(self.tables.grants, grant.grant_id, grant)
        params = devices.decision(user_code_hash, sub, grant, now)
        self.tables.devices[device.device_code_hash] = attrs.evolve(
            device, status=params["status"], sub=sub, grant_id=params["grant_id"],
        )
        return True

    @_answered
    def redeem_device_authorization(self, device_code_hash, access, refresh, now):
        device = self.tables.devices.get(device_code_hash)
        if device is not None and device.status == DEVICE_REDEEMED:
            self._revoke_grant(device.grant_id, now)
            return POLL_REUSED
        if (device is None or device.status != DEVICE_APPROVED or device.expires_at <= now
                or not self._issuable(device.grant_id, now)):
            return POLL_UNKNOWN
        self._issue(access, refresh)
        self.tables.devices[device_code_hash] = attrs.evolve(device, status=DEVICE_REDEEMED, polled_at=now)
        return POLL_REDEEMED

    @_answered
    def poll_device_authorization(self, device_code_hash, client_id, slow_down, now):
        outcome, changed = devices.poll(self.tables.devices.get(device_code_hash), client_id, slow_down, now)
        if changed is not None:
            self.tables.devices[device_code_hash] = changed
        return outcome

    # IGrantStore

    @_answered
    def get_grant(self, grant_id):
        return self.tables.grants.get(grant_id)

    @_answered
    def issue_tokens(self, access, refresh):
        self._issue(access, refresh)

    @_answered
    def start_grant(self, grant, access):
        if grant.grant_id in self.tables.grants:
            raise AlreadyExists(f"grant {grant.grant_id!r} exists already")
        if grant.client_id not in self.tables.clients:
            return False
        self._issue(access, None)
        self.tables.grants[grant.grant_id] = grant
        return True

    @_answered
    def claim_jti(self, client_id, jti, expires_at, now):
        kept = self.tables.client_assertions.get((client_id, jti))
        if kept is not None and kept > now:
            return False
        self.tables.client_assertions[(client_id, jti)] = expires_at
        return True

    def _issue(self, access, refresh) -> None:
        if access.token_hash in self.tables.access or (
            refresh is not None and refresh.token_hash in self.tables.refresh
        ):
            raise AlreadyExists("the token exists already")
        self.tables.access[access.token_hash] = access
        if refresh is not None:
            self.tables.refresh[refresh.token_hash] = refresh

    def _live_grant(self, grant_id) -> bool:
        grant = self.tables.grants.get(grant_id)
        return grant is not None and grant.revoked_at is None

    def _issuable(self, grant_id, now) -> bool:
        """As L{authsrv.store.rows.issuable}: a live grant whose user is not banned at C{now}."""
        if not self._live_grant(grant_id):
            return False
        ban = self.tables.bans.get(self.tables.grants[grant_id].sub)
        return ban is None or not ban.in_force(now)

    @_answered
    def find_access_token(self, token_hash, now, link_provider=None):
        access = self.tables.access.get(token_hash)
        if (
            access is None
            or token_hash in self.tables.access_revoked_at
            or access.expires_at <= now
            or not self._live_grant(access.grant_id)
        ):
            return None
        return attrs.evolve(access, user_ban=self.tables.bans.get(access.sub),
                            linked_user_id=self._linked_user_id(access.sub, link_provider))

    @_answered
    def get_refresh_token(self, token_hash, link_provider=None):
        refresh = self.tables.refresh.get(token_hash)
        grant = None if refresh is None else self.tables.grants.get(refresh.grant_id)
        if grant is None:
            return None
        return attrs.evolve(
            refresh,
            revoked=grant.revoked_at is not None,
            user_ban=self.tables.bans.get(refresh.sub),
            grant=grant,
            linked_user_id=self._linked_user_id(refresh.sub, link_provider),
        )

    @_answered
    def rotate_refresh(self, old_hash, new_refresh, new_access, replay, grace_until, now):
        old = self.tables.refresh.get(old_hash)
        if old is None or old.expires_at <= now or not self._live_grant(old.grant_id):
            return RefreshNotFound()
        if old.consumed_at is None:
            if not self._issuable(old.grant_id, now):
                return RefreshNotFound()
            self._issue(new_access, new_refresh)
            self.tables.refresh[old_hash] = attrs.evolve(
                old, consumed_at=now, grace_until=grace_until, replay=replay
            )
            return Rotated()
        if old.replay is not None and now < old.grace_until:
            return Replayed(old.replay) if self._issuable(old.grant_id, now) else RefreshNotFound()
        self._revoke_grant(old.grant_id, now)
        return Reused(old.grant_id)

    @_answered
    def revoke_token(self, token_hash, client_id, now):
        refresh = self.tables.refresh.get(token_hash)
        if refresh is not None and refresh.client_id == client_id:
            self._revoke_grant(refresh.grant_id, now)
            return RevokedRefresh(refresh.grant_id)
        access = self.tables.access.get(token_hash)
        if access is None or access.client_id != client_id:
            return NotRevoked()
        self.tables.access_revoked_at.setdefault(token_hash, now)
        return RevokedAccess(access.grant_id)

    def _revoke_grant(self, grant_id, now) -> bool:
        grant = self.tables.grants.get(grant_id)
        if grant is None or grant.revoked_at is not None:
            return False
        self.tables.grants[grant_id] = attrs.evolve(grant, revoked_at=now)
        return True

    @_answered
    def revoke_grant(self, grant_id, now):
        return self._revoke_grant(grant_id, now)

    @_answered
    def revoke_user_grants(self, sub, now):
        of_user = [grant.grant_id for grant in self.tables.grants.values() if grant.sub == sub]
        return sum(self._revoke_grant(grant_id, now) for grant_id in of_user)

    def _has_live_token(self, grant_id, now) -> bool:
        return any(
            access.grant_id == grant_id and access.expires_at > now and key not in self.tables.access_revoked_at
            for key, access in self.tables.access.items()
        ) or any(
            refresh.grant_id == grant_id and refresh.consumed_at is None and refresh.expires_at > now
            for refresh in self.tables.refresh.values()
        )

    def _ban_in_force(self, sub, now):
        ban = self.tables.bans.get(sub)
        return ban if ban is not None and ban.in_force(now) else None

    @_answered
    def list_user_grants(self, sub, now, after=None, limit=None):
        live = [g for g in self.tables.grants.values() if g.sub == sub and g.revoked_at is None and g.expires_at > now]
        return _page(sorted(live, key=lambda g: (g.created_at, g.grant_id)), after, limit,
                     lambda g: (g.created_at, g.grant_id))

    @_answered
    def access_state(self, sub, now):
        has_grant = any(
            grant.sub == sub and grant.revoked_at is None and self._has_live_token(grant.grant_id, now)
            for grant in self.tables.grants.values()
        )
        return AccessState(ban=self._ban_in_force(sub, now), has_active_grant=has_grant)

    @_answered
    def session_clients(self, sid):
        return sorted({grant.client_id for grant in self.tables.grants.values() if grant.sid == sid})

    @_answered
    def save_consent(self, sub, client_id, scope, now, stored_client=True):
        if stored_client and client_id not in self.tables.clients:
            return None
        earlier = self.tables.consents.get((sub, client_id))
        merged = frozenset(scope) | (earlier.scope if earlier is not None else frozenset())
        self.tables.consents[sub, client_id] = Consent(sub, client_id, merged, now)
        return merged

    @_answered
    def get_consent(self, sub, client_id):
        consent = self.tables.consents.get((sub, client_id))
        return None if consent is None else consent.scope

    @_answered
    def list_user_consents(self, sub):
        return [self.tables.consents[key] for key in sorted(self.tables.consents) if key[0] == sub]

    @_answered
    def revoke_consent(self, sub, client_id):
        return self.tables.consents.pop((sub, client_id), None) is not None

    # IBanStore

    @_answered
    def ban_user(self, ban):
        self.tables.bans[ban.sub] = ban

    @_answered
    def unban_user(self, sub):
        return self.tables.bans.pop(sub, None) is not None

    @_answered
    def get_ban(self, sub, now):
        return self._ban_in_force(sub, now)

    @_answered
    def list_bans(self, now, after=None, limit=None):
        return _page([self.tables.bans[sub] for sub in sorted(self.tables.bans) if self.tables.bans[sub].in_force(now)],
                     after, limit, lambda b: b.sub)

    # IImportStore

    @_answered
    def import_batch(self, batch):
        keys = {
            "clients": lambda c: c.client_id, "bans": lambda b: b.sub, "grants": lambda g: g.grant_id,
            "refresh_tokens": lambda r: r.token_hash, "consents": lambda c: (c.sub, c.client_id),
        }
        tables = {"clients": self.tables.clients, "bans": self.tables.bans, "grants": self.tables.grants,
                  "refresh_tokens": self.tables.refresh, "consents": self.tables.consents}
        counts = {}
        for kind, table in tables.items():
            fresh = [r for r in getattr(batch, kind) if keys[kind](r) not in table]
            table.update((keys[kind](r), r) for r in fresh)
            counts[kind] = len(fresh)
        linked = []
        for a in batch.linked:
            if a.account_id not in self.tables.linked and self._linked_key(a.sub, a.provider) is None \
                    and self._linked_elsewhere(a) is None:
                self.tables.linked[a.account_id] = a
                linked.append(a)
        counts["linked"] = len(linked)
        return counts

    # ILinkedAccountStore

    def _linked_key(self, sub, provider):
        return next(
            (key for key, account in self.tables.linked.items() if (account.sub, account.provider) == (sub, provider)),
            None,
        )

    def _linked_elsewhere(self, account):
        """The sub of another user holding C{account}'s provider account, or None."""
        return next(
            (a.sub for a in self.tables.linked.values()
             if (a.provider, a.provider_user_id) == (account.provider, account.provider_user_id)
             and a.sub != account.sub),
            None,
        )

    def _linked_user_id(self, sub, provider):
        """What a lookup asked for C{provider}'s link reads (L{authsrv.records.NOT_READ} when not asked)."""
        if provider is None:
            return NOT_READ
        account = self.tables.linked.get(self._linked_key(sub, provider))
        return None if account is None else account.provider_user_id

    @_answered
    def link_account(self, account, displacing=None):
        key = self._linked_key(account.sub, account.provider)
        if account.account_id in self.tables.linked and account.account_id != key:
            raise AlreadyExists(f"account {account.account_id!r} exists already")
        held = None if displacing is None else self.tables.linked.get(displacing.account_id)
        if held is not None and (held.version, held.provider, held.provider_user_id) == (
                displacing.version, account.provider, account.provider_user_id):
            del self.tables.linked[held.account_id]
        if self._linked_elsewhere(account) is not None:
            raise AlreadyLinked.of(account.provider, account.provider_user_id)
        replaced = self.tables.linked.pop(key, None)
        self.tables.linked[account.account_id] = account
        return replaced

    @_answered
    def get_linked_account(self, sub, provider):
        return self.tables.linked.get(self._linked_key(sub, provider))

    @_answered
    def linked_sub(self, provider, provider_user_id):
        return next((a.sub for a in self.tables.linked.values()
                     if (a.provider, a.provider_user_id) == (provider, provider_user_id)), None)

    @_answered
    def unlink_account(self, sub, provider):
        return self.tables.linked.pop(self._linked_key(sub, provider), None)

    @_answered
    def update_linked_tokens(
        self, account_id, expected_version, access_token_enc, refresh_token_enc, scope, expires_at, now,
    ):
        account = self.tables.linked.get(account_id)
        if account is None or account.version != expected_version:
            return None
        updated = attrs.evolve(
            account,
            access_token_enc=access_token_enc,
            refresh_token_enc=account.refresh_token_enc if refresh_token_enc is None else refresh_token_enc,
            scope=scope, expires_at=expires_at, updated_at=now, version=account.version + 1,
        )
        self.tables.linked[account_id] = updated
        return updated

    @_answered
    def acquire_link_lock(self, account_id, holder, now, ttl):
        # Taken when there is no lease, it has run out, or the holder renews it.
        lease = self.tables.link_locks.get(account_id)
        if lease is not None and lease[1] > now and lease[0] != holder:
            return False
        self.tables.link_locks[account_id] = (holder, now + ttl)
        return True

    @_answered
    def release_link_lock(self, account_id, holder):
        lease = self.tables.link_locks.get(account_id)
        if lease is not None and lease[0] == holder:
            del self.tables.link_locks[account_id]

    # ILoginThrottle

    @_answered
    def attempt(self, account, address, device_hash, policy, now):
        live = [row for row in self.tables.login_attempts.values() if row.expires_at > now]
        pair = [row for row in live if row.account == account and row.address == address]

        def free_at(rows, limit):
            expiries = sorted((row.expires_at for row in rows), reverse=True)
            return expiries[limit - 1] if len(expiries) >= limit else None

        counts = throttle.Counts(
            pair=len(pair),
            pair_last=max((row.at for row in pair), default=None),
            address_free_at=free_at([row for row in live if row.address == address], policy.failures_per_address),
            account_free_at=free_at([row for row in live if row.account == account], policy.failures_per_account),
            known_device=self.tables.known_devices.get((account, device_hash), 0) > now,
        )
        wait = throttle.wait(policy, counts, now)
        if wait is not None:
            return ThrottleDecision(wait=wait, ticket=None)
        self.tables.last_ticket += 1
        self.tables.login_attempts[self.tables.last_ticket] = LoginAttempt(account, address, now, now + policy.window)
        return ThrottleDecision(wait=None, ticket=self.tables.last_ticket)

    @_answered
    def forgive(self, ticket):
        return self.tables.login_attempts.pop(ticket, None) is not None

    @_answered
    def succeeded(self, account, address, now):
        attempts = self.tables.login_attempts
        for ticket in [ticket for ticket, row in attempts.items() if (row.account, row.address) == (account, address)]:
            del attempts[ticket]

    # IKnownDeviceStore

    @_answered
    def remember_device(self, account, device_hash, expires_at):
        self.tables.known_devices[account, device_hash] = expires_at

    # IProofReplayStore

    @_answered
    def first_use(self, replay_key, expires_at, now):
        seen = self.tables.dpop_proofs.get(replay_key)
        if seen is not None and seen > now:
            return False
        self.tables.dpop_proofs[replay_key] = expires_at
        return True

    # IFactorStore

    @_answered
    def enrol_totp(self, sub, secret_enc, step, now):
        self.tables.totp[sub] = TotpFactor(sub=sub, secret_enc=secret_enc, created_at=now, last_step=step)

    @_answered
    def get_totp(self, sub):
        return self.tables.totp.get(sub)

    @_answered
    def use_totp_step(self, sub, step):
        factor = self.tables.totp.get(sub)
        if factor is None or factor.last_step >= step:
            return False
        self.tables.totp[sub] = attrs.evolve(factor, last_step=step)
        return True

    @_answered
    def replace_recovery_codes(self, sub, code_hashes, now):
        self.tables.recovery_codes[sub] = (now, set(code_hashes))

    @_answered
    def use_recovery_code(self, sub, code_hash):
        _, unused = self.tables.recovery_codes.get(sub, (0, set()))
        if code_hash not in unused:
            return False
        unused.remove(code_hash)
        return True

    @_answered
    def list_factors(self, sub):
        factors = []
        totp = self.tables.totp.get(sub)
        if totp is not None:
            factors.append(Factor(kind=TOTP_FACTOR, created_at=totp.created_at))
        created_at, unused = self.tables.recovery_codes.get(sub, (0, set()))
        if unused:
            factors.append(Factor(kind=RECOVERY_FACTOR, created_at=created_at, remaining=len(unused)))
        return factors

    @_answered
    def reset_factors(self, sub):
        tables = self.tables
        kept = [table.pop(sub, None) for table in (tables.totp, tables.recovery_codes, tables.mfa_demands)]
        passkeys = [key for key, passkey in tables.passkeys.items() if passkey.sub == sub]
        for key in passkeys:
            del tables.passkeys[key]
        return any(row is not None for row in kept[:2]) or bool(passkeys)

    @_answered
    def mfa_demanded(self, sub, now):
        return self.tables.mfa_demands.setdefault(sub, now)

    @_answered
    def add_passkey(self, passkey):
        _insert(self.tables.passkeys, passkey.credential_id, passkey)

    @_answered
    def get_passkey(self, credential_id):
        return self.tables.passkeys.get(credential_id)

    @_answered
    def list_passkeys(self, sub):
        mine = [p for p in self.tables.passkeys.values() if p.sub == sub]
        return sorted(mine, key=lambda p: (p.created_at, p.credential_id))

    @_answered
    def use_passkey(self, credential_id, sign_count, backup_state, now):
        passkey = self.tables.passkeys.get(credential_id)
        if passkey is None or not (passkey.sign_count < sign_count or passkey.sign_count == sign_count == 0):
            return False
        self.tables.passkeys[credential_id] = attrs.evolve(
            passkey, sign_count=sign_count, backup_state=backup_state, last_used=now
        )
        return True

    @_answered
    def remove_passkey(self, sub, credential_id):
        passkey = self.tables.passkeys.get(credential_id)
        if passkey is None or passkey.sub != sub:
            return False
        del self.tables.passkeys[credential_id]
        return True

    # IStore

    @_answered
    def ping(self):
        return None

    @_answered
    def gc(self, now, batch_size):
        """The SQL stores' housekeeping, kind by kind, each up to C{batch_size} rows."""
        tables = self.tables

        def expired(table: dict, is_expired) -> int:
            keys = [key for key, row in table.items() if is_expired(row)][:batch_size]
            for key in keys:
                del table[key]
            return len(keys)

        def ended(until) -> bool:
            return until is not None and until <= now

        count = expired(tables.codes, lambda code: code.expires_at <= now)
        count += expired(tables.interactions, lambda interaction: interaction.expires_at <= now)
        count += expired(tables.devices, lambda device: device.expires_at <= now)
        count += expired(tables.link_attempts, lambda attempt: attempt.expires_at <= now)
        count += expired(tables.pushed, lambda pushed: pushed.expires_at <= now)
        count += expired(tables.sessions, lambda session: session.expires_at <= now)
        count += expired(tables.access, lambda access: access.expires_at <= now)
        count += expired(tables.refresh, lambda refresh: refresh.expires_at <= now)
        count += expired(tables.bans, lambda ban: ended(ban.until))
        count += expired(tables.link_locks, lambda lease: lease[1] <= now)
        count += expired(tables.login_attempts, lambda attempt: attempt.expires_at <= now)
        count += expired(tables.known_devices, lambda expires_at: expires_at <= now)
        count += expired(tables.client_assertions, lambda expires_at: expires_at <= now)
        count += expired(tables.dpop_proofs, lambda expires_at: expires_at <= now)

        def live_code(grant) -> bool:
            return any(c.grant_id == grant.grant_id and c.expires_at > now for c in tables.codes.values())

        count += self._drop_grants(lambda grant: grant.revoked_at is not None and not live_code(grant), batch_size)
        count += self._drop_grants(
            lambda grant: grant.expires_at <= now
            and not live_code(grant)
            and not self._has_live_token(grant.grant_id, now),
            batch_size,
        )
        spent = [
            key for key, refresh in tables.refresh.items() if refresh.replay is not None and refresh.grace_until <= now
        ][:batch_size]
        for key in spent:
            tables.refresh[key] = attrs.evolve(tables.refresh[key], replay=None)
        for marks, rows in ((tables.code_used_at, tables.codes), (tables.access_revoked_at, tables.access)):
            for key in set(marks) - set(rows):
                del marks[key]
        return count + len(spent)

    def _drop_grants(self, dead, batch_size) -> int:
        """Drop up to C{batch_size} grants for which C{dead} holds, with their codes and tokens."""
        tables = self.tables
        gone = {key for key, grant in tables.grants.items() if dead(grant)}
        gone = set(sorted(gone)[:batch_size])
        for key in gone:
            del tables.grants[key]
        for table in (tables.codes, tables.access, tables.refresh):
            for key in [key for key, row in table.items() if row.grant_id in gone]:
                del table[key]
        return len(gone)

    def close(self):
        return succeed(None)
