"""
Security events: every one a structured twisted.logger event in the
C{authsrv.audit} namespace, written as one JSON line by
L{authsrv.auditlog} with the fields below (docs/audit.md). They never carry
a secret, a password, a code, a cookie or a whole token: tokens are named
by grant id or an 8-hex fingerprint.

The function names and keyword arguments are what flows call and other
observers (metrics) read from the event; the field names are the audit
file's schema.
"""

from __future__ import annotations

from twisted.logger import Logger

log = Logger(namespace="authsrv.audit")

COMMON_FIELDS = (
    "event", "time", "sub", "client_id", "grant_id", "session_id", "address", "outcome", "reason", "actor",
)
"""On every audit line, C{null} where they do not apply."""

EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "login.succeeded": (),
    "login.failed": ("login",),
    "login.throttled": ("login", "retry_after"),
    "login.suspended": (),
    "login.hint_mismatch": ("hinted_sub",),
    "throttle.engaged": ("login", "retry_after"),
    "consent.given": ("scope",),
    "consent.denied": (),
    "code.issued": (),
    "request.pushed": (),
    "request_uri.refused": (),
    "code.reused": (),
    "token.issued": ("grant_type", "token_fp"),
    "refresh.reused": (),
    "device.requested": ("scope",),
    "device.approved": ("scope",),
    "device.denied": (),
    "device.code_failed": (),
    "device.code_reused": (),
    "assertion.replayed": (),
    "token.revoked": ("kind",),
    "grant.revoked": (),
    "session.ended": (),
    "logout.backchannel": (),
    "user.banned": ("until",),
    "user.unbanned": (),
    "user.grants_revoked": ("count",),
    "client.created": ("source",),
    "client.changed": ("source", "fields"),
    "client.deleted": ("source",),
    "client.secret_rotated": ("previous_until",),
    "registration.refused": (),
    "user.sessions_ended": ("count",),
    "user.consents_revoked": ("count",),
    "user.created": ("login",),
    "user.password_set": (),
    "user.disabled": (),
    "user.enabled": (),
    "user.deleted": ("login",),
    "mfa.enrolled": ("kind",),
    "mfa.succeeded": ("method",),
    "mfa.failed": (),
    "mfa.put_off": ("grace_until",),
    "mfa.recovery_codes_replaced": (),
    "mfa.reset": (),
    "passkey.registered": ("credential", "synced"),
    "passkey.removed": ("credential",),
    "passkey.succeeded": ("credential",),
    "passkey.refused": ("credential",),
    "account.session_ended": (),
    "account.app_revoked": ("grants",),
    "account.password_changed": ("sessions_ended",),
    "account.password_change_refused": (),
    "key.rotated": ("algorithms", "active"),
    "config.loaded": ("path", "issuer", "clients"),
    "rate.limited": ("endpoint", "retry_after"),
    "chat.linked": ("provider", "account_id", "provider_user_id"),
    "chat.link_refused": ("provider", "provider_user_id"),
    "chat.stale_link_replaced": ("provider", "account_id", "provider_user_id", "former_sub"),
    "chat.unlinked": ("provider",),
    "chat.refreshed": ("provider", "account_id", "rotated"),
    "chat.refresh_failed": ("provider", "account_id"),
}
"""Each event's own fields, beyond L{COMMON_FIELDS}."""


def _emit(event: str, text: str, outcome: str, **fields) -> None:
    log.info(text, event=event, outcome=outcome, **fields)


def login_succeeded(*, sub: str, client_id: str, address: str) -> None:
    _emit("login.succeeded", "login of {sub} for {client_id} from {address}", "success", sub=sub,
          client_id=client_id, address=address)


def login_failed(*, login: str, reason: str, address: str) -> None:
    _emit("login.failed", "failed login as {login!r} from {address}: {reason}", "failure", login=login,
          reason=reason, address=address)


def login_throttled(*, login: str, address: str, retry_after: int) -> None:
    _emit("login.throttled", "login as {login!r} from {address} throttled for {retry_after}s", "refused",
          login=login, address=address, retry_after=retry_after)


def login_suspended(*, sub: str, address: str, reason: str) -> None:
    _emit("login.suspended", "correct password for suspended account {sub} from {address}: {reason}", "refused",
          sub=sub, address=address, reason=reason)


def login_hint_mismatch(*, sub: str, hinted_sub: str, client_id: str, address: str) -> None:
    """Another user than the id_token_hint names signed in: the client hears login_required."""
    _emit("login.hint_mismatch", "{sub} signed in for {client_id} from {address}, which asked for {hinted_sub}",
          "refused", sub=sub, hinted_sub=hinted_sub, client_id=client_id, address=address)


def throttle_engaged(*, login: str, address: str, reason: str, retry_after: int | None = None) -> None:
    """The server refused a password check to protect itself, before any per-account count."""
    _emit("throttle.engaged", "password check for {login!r} from {address} refused: {reason}", "refused",
          login=login, address=address, reason=reason, retry_after=retry_after)


def consent_given(*, sub: str, client_id: str, scope: str, address: str) -> None:
    """C{address}: the browser's that approved."""
    _emit("consent.given", "{sub} consented to {scope} for {client_id} from {address}", "success", sub=sub,
          client_id=client_id, scope=scope, address=address)


def consent_denied(*, sub: str, client_id: str, address: str) -> None:
    _emit("consent.denied", "{sub} denied consent to {client_id} from {address}", "refused", sub=sub,
          client_id=client_id, address=address)


def code_issued(*, sub: str, client_id: str, grant_id: str, session_id: str, address: str) -> None:
    """
    C{session_id}: the public sid of the browser session the code was issued
    in, never its cookie; C{address}: the browser's.
    """
    _emit("code.issued", "code for {sub} to {client_id} (grant {grant_id}) from {address}", "success", sub=sub,
          client_id=client_id, grant_id=grant_id, session_id=session_id, address=address)


def request_pushed(*, client_id: str, address: str) -> None:
    _emit("request.pushed", "authorization request pushed by {client_id} from {address}", "success",
          client_id=client_id, address=address)


def request_uri_refused(*, client_id: str, address: str) -> None:
    """
    A browser (at C{address}) brought a request_uri that was used, expired,
    unknown or another client's: a replay, or stale.
    """
    _emit("request_uri.refused", "request_uri refused for {client_id} from {address}", "refused",
          client_id=client_id, address=address, reason="unknown, used, expired or another client's")


def token_issued(*, sub: str, client_id: str, grant_id: str, grant_type: str, token_fp: str,
                 address: str | None) -> None:
    """A refresh is this event with C{grant_type} C{refresh_token}; C{address} is the caller's."""
    _emit("token.issued", "{grant_type} tokens for {sub} to {client_id} (grant {grant_id}, {token_fp})", "success",
          sub=sub, client_id=client_id, grant_id=grant_id, grant_type=grant_type, token_fp=token_fp,
          address=address)


def code_reused(*, client_id: str, grant_id: str, address: str | None) -> None:
    """C{address}: where the replay came from, the thief's or the victim's, for the forensics."""
    _emit("code.reused", "authorization code replayed by {client_id} from {address}: grant {grant_id} revoked",
          "refused", client_id=client_id, grant_id=grant_id, address=address, reason="code reused")


def device_requested(*, client_id: str, scope: str, address: str) -> None:
    """C{address}: the device's."""
    _emit("device.requested", "device authorization for {client_id} started from {address}", "success",
          client_id=client_id, scope=scope, address=address)


def device_approved(*, sub: str, client_id: str, grant_id: str, scope: str, address: str) -> None:
    """C{address}: the browser's at the verification page, not the device's."""
    _emit("device.approved", "{sub} approved a device of {client_id} (grant {grant_id}) from {address}", "success",
          sub=sub, client_id=client_id, grant_id=grant_id, scope=scope, address=address)


def device_denied(*, sub: str, client_id: str, address: str) -> None:
    _emit("device.denied", "{sub} denied a device of {client_id} from {address}", "refused", sub=sub,
          client_id=client_id, address=address)


def device_code_failed(*, address: str, reason: str, sub: str | None = None) -> None:
    """A user code that is wrong, used or expired, or one refused by the throttle: guessing shows here."""
    _emit("device.code_failed", "user code refused from {address}: {reason}", "failure", address=address,
          reason=reason, sub=sub)


def device_code_reused(*, client_id: str, grant_id: str, address: str | None) -> None:
    _emit("device.code_reused", "device code replayed by {client_id} from {address}: grant {grant_id} revoked",
          "refused", client_id=client_id, grant_id=grant_id, address=address, reason="device code reused")


def refresh_reused(*, client_id: str, grant_id: str, address: str | None) -> None:
    """C{address}: where the reused token came from, the thief's or the victim's, for the forensics."""
    _emit("refresh.reused", "rotated refresh token reused by {client_id} from {address}: grant {grant_id} revoked",
          "refused", client_id=client_id, grant_id=grant_id, address=address, reason="refresh token reused")


def assertion_replayed(*, client_id: str, address: str | None) -> None:
    _emit("assertion.replayed", "client assertion of {client_id} replayed from {address}", "refused",
          client_id=client_id, reason="client_assertion jti already used", address=address)


def token_revoked(*, client_id: str, grant_id: str, kind: str, address: str | None) -> None:
    _emit("token.revoked", "{kind} token of grant {grant_id} revoked by {client_id} from {address}", "success",
          client_id=client_id, grant_id=grant_id, kind=kind, address=address)


def session_ended(*, sub: str, session_id: str, reason: str, address: str | None) -> None:
    """C{address}: the browser's whose request ended it; None for the operator's and a ban's doing."""
    _emit("session.ended", "browser session {session_id} of {sub} ended: {reason}", "success", sub=sub,
          session_id=session_id, reason=reason, address=address)


def backchannel_logout(*, client_id: str, session_id: str, outcome: str) -> None:
    _emit("logout.backchannel", "back-channel logout of {session_id} to {client_id}: {outcome}", outcome,
          client_id=client_id, session_id=session_id)


def grant_revoked(*, sub: str, client_id: str, grant_id: str, reason: str, address: str | None) -> None:
    """C{address}: the token request's that found its user no longer allowed."""
    _emit("grant.revoked", "grant {grant_id} of {sub} for {client_id} revoked: {reason}", "success",
          sub=sub, client_id=client_id, grant_id=grant_id, reason=reason, address=address)


def user_banned(*, sub: str, reason: str | None, until: int | None, actor: str) -> None:
    _emit("user.banned", "{sub} banned by {actor}: {reason}", "success", sub=sub, reason=reason, until=until,
          actor=actor)


def user_unbanned(*, sub: str, actor: str) -> None:
    _emit("user.unbanned", "{sub} unbanned by {actor}", "success", sub=sub, actor=actor)


def user_grants_revoked(*, sub: str, count: int, actor: str) -> None:
    _emit("user.grants_revoked", "{count} grants of {sub} revoked by {actor}", "success", sub=sub, count=count,
          actor=actor)


def client_created(*, client_id: str, source: str, actor: str, address: str | None = None) -> None:
    """
    C{source}: C{config} for a client the config file declares, C{operator}
    for one the operator added, C{registration} for one that registered
    itself from C{address}.
    """
    _emit("client.created", "client {client_id} ({source}) created by {actor}", "success", client_id=client_id,
          source=source, actor=actor, address=address)


def client_changed(*, client_id: str, source: str, actor: str, fields: list[str] | None = None,
                   address: str | None = None) -> None:
    """C{fields}: the settings an operator (or a registered client, from C{address}) changed, when known."""
    _emit("client.changed", "client {client_id} ({source}) changed by {actor}", "success", client_id=client_id,
          source=source, actor=actor, fields=fields, address=address)


def client_deleted(*, client_id: str, source: str, actor: str, reason: str | None = None,
                   address: str | None = None) -> None:
    _emit("client.deleted", "client {client_id} ({source}) deleted by {actor}", "success", client_id=client_id,
          source=source, actor=actor, reason=reason, address=address)


def registration_refused(*, address: str, reason: str) -> None:
    """A client's registration (RFC 7591) was refused: no or a wrong initial access token, or its metadata."""
    _emit("registration.refused", "registration from {address} refused: {reason}", "failure", address=address,
          reason=reason)


def key_rotated(*, algorithms: list[str], active: dict[str, str], actor: str) -> None:
    """C{active}: the kid now signing, by algorithm (key ids are public, in the JWKS)."""
    _emit("key.rotated", "signing keys rotated by {actor}; now signing with {active}", "success",
          algorithms=list(algorithms), active=active, actor=actor)


def config_loaded(*, path: str | None, issuer: str, clients: int) -> None:
    _emit("config.loaded", "config {path} loaded: issuer {issuer}, {clients} declared clients", "success",
          path=path, issuer=issuer, clients=clients)


def chat_linked(*, sub: str, provider: str, account_id: str, provider_user_id: str, address: str) -> None:
    _emit("chat.linked", "{sub} linked {provider} account {provider_user_id} (link {account_id}) from {address}",
          "success", sub=sub, provider=provider, account_id=account_id, provider_user_id=provider_user_id,
          address=address)


def chat_link_refused(*, sub: str, provider: str, provider_user_id: str, address: str) -> None:
    _emit("chat.link_refused", "{sub} may not link {provider} account {provider_user_id} from {address}: it is"
          " linked to another user", "refused", sub=sub, provider=provider, provider_user_id=provider_user_id,
          address=address)


def chat_stale_link_replaced(*, sub: str, provider: str, account_id: str, provider_user_id: str,
                             former_sub: str, address: str) -> None:
    _emit("chat.stale_link_replaced", "{sub} took {provider} account {provider_user_id} from {former_sub}, a user"
          " no identity backend knows any more (link {account_id} removed), from {address}", "success", sub=sub,
          provider=provider, account_id=account_id, provider_user_id=provider_user_id, former_sub=former_sub,
          address=address)


def chat_unlinked(*, sub: str, provider: str, address: str) -> None:
    _emit("chat.unlinked", "{sub} unlinked their {provider} account from {address}", "success", sub=sub,
          provider=provider, address=address)


def chat_refreshed(*, sub: str, provider: str, account_id: str, rotated: bool) -> None:
    _emit("chat.refreshed", "{provider} token of {sub} refreshed (link {account_id}, refresh token rotated:"
          " {rotated})", "success", sub=sub, provider=provider, account_id=account_id, rotated=rotated)


def chat_refresh_failed(*, sub: str, provider: str, account_id: str, reason: str) -> None:
    _emit("chat.refresh_failed", "{provider} token of {sub} not refreshed (link {account_id}): {reason}", "failure",
          sub=sub, provider=provider, account_id=account_id, reason=reason)


def rate_limited(*, endpoint: str, client_id: str | None, address: str | None, retry_after: int) -> None:
    """At most once per bucket a minute (L{authsrv.flows.ratelimit.REPORT_WINDOW}), however many are refused."""
    _emit("rate.limited", "requests of {client_id} from {address} to {endpoint} over their rate; retry in"
          " {retry_after}s", "refused", endpoint=endpoint, client_id=client_id, address=address,
          retry_after=retry_after)


def client_secret_rotated(*, client_id: str, previous_until: int | None, actor: str) -> None:
    _emit("client.secret_rotated", "secret of client {client_id} rotated by {actor}; the previous one works until"
          " {previous_until}", "success", client_id=client_id, previous_until=previous_until, actor=actor)


def user_sessions_ended(*, sub: str, count: int, actor: str) -> None:
    _emit("user.sessions_ended", "{count} browser sessions of {sub} ended by {actor}", "success", sub=sub,
          count=count, actor=actor)


def user_consents_revoked(*, sub: str, count: int, actor: str) -> None:
    _emit("user.consents_revoked", "{count} consents of {sub} revoked by {actor}", "success", sub=sub, count=count,
          actor=actor)


def user_created(*, sub: str, login: str, actor: str) -> None:
    _emit("user.created", "user {login} ({sub}) created by {actor}", "success", sub=sub, login=login, actor=actor)


def user_password_set(*, sub: str, actor: str) -> None:
    _emit("user.password_set", "password of {sub} set by {actor}", "success", sub=sub, actor=actor)


def user_disabled(*, sub: str, reason: str | None, actor: str) -> None:
    _emit("user.disabled", "{sub} disabled by {actor}: {reason}", "success", sub=sub, reason=reason, actor=actor)


def user_enabled(*, sub: str, actor: str) -> None:
    _emit("user.enabled", "{sub} enabled by {actor}", "success", sub=sub, actor=actor)


def user_deleted(*, sub: str, login: str, actor: str) -> None:
    _emit("user.deleted", "user {login} ({sub}) deleted by {actor}", "success", sub=sub, login=login, actor=actor)


def mfa_enrolled(*, sub: str, kind: str, address: str) -> None:
    _emit("mfa.enrolled", "{sub} enrolled a {kind} factor from {address}", "success", sub=sub, kind=kind,
          address=address)


def mfa_succeeded(*, sub: str, method: str, address: str) -> None:
    _emit("mfa.succeeded", "second factor ({method}) of {sub} from {address}", "success", sub=sub, method=method,
          address=address)


def mfa_failed(*, sub: str, address: str, reason: str) -> None:
    _emit("mfa.failed", "second factor of {sub} refused from {address}: {reason}", "failure", sub=sub,
          address=address, reason=reason)


def mfa_enrolment_put_off(*, sub: str, grace_until: int, address: str) -> None:
    _emit("mfa.put_off", "{sub} put off enrolling a second factor (grace until {grace_until}) from {address}",
          "success", sub=sub, grace_until=grace_until, address=address)


def recovery_codes_replaced(*, sub: str, address: str) -> None:
    _emit("mfa.recovery_codes_replaced", "{sub} has a new set of recovery codes, from {address}", "success",
          sub=sub, address=address)


def factors_reset(*, sub: str, actor: str) -> None:
    _emit("mfa.reset", "second factors of {sub} reset by {actor}", "success", sub=sub, actor=actor)


def passkey_registered(*, sub: str, credential: str, synced: bool, address: str) -> None:
    _emit("passkey.registered", "{sub} registered passkey {credential} (synced: {synced}) from {address}",
          "success", sub=sub, credential=credential, synced=synced, address=address)


def passkey_removed(*, sub: str, credential: str, address: str) -> None:
    _emit("passkey.removed", "{sub} removed passkey {credential} from {address}", "success", sub=sub,
          credential=credential, address=address)


def passkey_succeeded(*, sub: str, credential: str, address: str) -> None:
    _emit("passkey.succeeded", "passkey {credential} of {sub} from {address}", "success", sub=sub,
          credential=credential, address=address)


def passkey_refused(*, sub: str | None, credential: str, address: str, reason: str) -> None:
    _emit("passkey.refused", "passkey {credential} of {sub} refused from {address}: {reason}", "failure", sub=sub,
          credential=credential, address=address, reason=reason)


def account_session_ended(*, sub: str, session_id: str, address: str) -> None:
    """C{session_id}: the session signed out; C{address}: the browser's that signed it out."""
    _emit("account.session_ended", "{sub} signed out their session {session_id} from the account page at"
          " {address}", "success", sub=sub, session_id=session_id, address=address)


def account_app_revoked(*, sub: str, client_id: str, grants: int, address: str) -> None:
    _emit("account.app_revoked", "{sub} revoked {client_id} ({grants} grants and the consent) from {address}",
          "success", sub=sub, client_id=client_id, grants=grants, address=address)


def password_changed(*, sub: str, sessions_ended: int, address: str) -> None:
    _emit("account.password_changed", "{sub} changed their password from {address}; {sessions_ended} other"
          " sessions ended", "success", sub=sub, sessions_ended=sessions_ended, address=address)


def password_change_refused(*, sub: str, reason: str, address: str) -> None:
    _emit("account.password_change_refused", "password change of {sub} from {address} refused: {reason}",
          "failure", sub=sub, reason=reason, address=address)
