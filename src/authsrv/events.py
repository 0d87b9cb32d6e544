"""
Security events: every one a structured twisted.logger event in the
C{authsrv.audit} namespace with an C{event} field for JSON consumers
(C{twist --log-format json}). They never carry a secret, a password or a
whole token: tokens are named by grant id, jti or an 8-hex fingerprint.
"""

from __future__ import annotations

from twisted.logger import Logger

log = Logger(namespace="authsrv.audit")


def _emit(event: str, text: str, **fields) -> None:
    log.info(text, event=event, **fields)


def login_succeeded(*, sub: str, client_id: str, address: str) -> None:
    _emit("login.succeeded", "login of {sub} for {client_id} from {address}", sub=sub,
          client_id=client_id, address=address)


def login_failed(*, login: str, reason: str, address: str) -> None:
    _emit("login.failed", "failed login as {login!r} from {address}: {reason}", login=login,
          reason=reason, address=address)


def login_throttled(*, login: str, address: str, retry_after: int) -> None:
    _emit("login.throttled", "login as {login!r} from {address} throttled for {retry_after}s", login=login,
          address=address, retry_after=retry_after)


def login_suspended(*, sub: str, address: str, reason: str) -> None:
    _emit("login.suspended", "correct password for suspended account {sub} from {address}: {reason}", sub=sub,
          address=address, reason=reason)


def consent_given(*, sub: str, client_id: str, scope: str) -> None:
    _emit("consent.given", "{sub} consented to {scope} for {client_id}", sub=sub,
          client_id=client_id, scope=scope)


def consent_denied(*, sub: str, client_id: str) -> None:
    _emit("consent.denied", "{sub} denied consent to {client_id}", sub=sub, client_id=client_id)


def code_issued(*, sub: str, client_id: str, grant_id: str) -> None:
    _emit("code.issued", "code for {sub} to {client_id} (grant {grant_id})", sub=sub,
          client_id=client_id, grant_id=grant_id)


def token_issued(*, sub: str, client_id: str, grant_id: str, grant_type: str, token_fp: str) -> None:
    _emit("token.issued", "{grant_type} tokens for {sub} to {client_id} (grant {grant_id}, {token_fp})",
          sub=sub, client_id=client_id, grant_id=grant_id, grant_type=grant_type, token_fp=token_fp)


def code_reused(*, client_id: str, grant_id: str) -> None:
    _emit("code.reused", "authorization code replayed by {client_id}: grant {grant_id} revoked",
          client_id=client_id, grant_id=grant_id)


def refresh_reused(*, client_id: str, grant_id: str) -> None:
    _emit("refresh.reused", "rotated refresh token reused by {client_id}: grant {grant_id} revoked",
          client_id=client_id, grant_id=grant_id)


def token_revoked(*, client_id: str, grant_id: str, kind: str) -> None:
    _emit("token.revoked", "{kind} token of grant {grant_id} revoked by {client_id}",
          client_id=client_id, grant_id=grant_id, kind=kind)


def session_ended(*, sub: str, sid: str, reason: str) -> None:
    _emit("session.ended", "browser session {sid} of {sub} ended: {reason}", sub=sub, sid=sid,
          reason=reason)


def backchannel_logout(*, client_id: str, sid: str, outcome: str) -> None:
    _emit("logout.backchannel", "back-channel logout of {sid} to {client_id}: {outcome}",
          client_id=client_id, sid=sid, outcome=outcome)


def grant_revoked(*, sub: str, client_id: str, grant_id: str, reason: str) -> None:
    _emit("grant.revoked", "grant {grant_id} of {sub} for {client_id} revoked: {reason}",
          sub=sub, client_id=client_id, grant_id=grant_id, reason=reason)


def user_banned(*, sub: str, reason: str | None, until: int | None, by: str) -> None:
    _emit("user.banned", "{sub} banned by {by}: {reason}", sub=sub, reason=reason, until=until, by=by)


def user_unbanned(*, sub: str, by: str) -> None:
    _emit("user.unbanned", "{sub} unbanned by {by}", sub=sub, by=by)


def user_grants_revoked(*, sub: str, count: int, by: str) -> None:
    _emit("user.grants_revoked", "{count} grants of {sub} revoked by {by}", sub=sub, count=count, by=by)


def chat_linked(*, sub: str, provider: str, account_id: str, provider_user_id: str) -> None:
    _emit("chat.linked", "{sub} linked {provider} account {provider_user_id} (link {account_id})",
          sub=sub, provider=provider, account_id=account_id, provider_user_id=provider_user_id)


def chat_unlinked(*, sub: str, provider: str) -> None:
    _emit("chat.unlinked", "{sub} unlinked their {provider} account", sub=sub, provider=provider)


def chat_refreshed(*, sub: str, provider: str, account_id: str, rotated: bool) -> None:
    _emit("chat.refreshed", "{provider} token of {sub} refreshed (link {account_id}, refresh token rotated:"
          " {rotated})", sub=sub, provider=provider, account_id=account_id, rotated=rotated)


def chat_refresh_failed(*, sub: str, provider: str, account_id: str, reason: str) -> None:
    _emit("chat.refresh_failed", "{provider} token of {sub} not refreshed (link {account_id}): {reason}",
          sub=sub, provider=provider, account_id=account_id, reason=reason)


def rate_limited(*, endpoint: str, client_id: str | None, address: str | None, retry_after: int) -> None:
    """At most once per bucket a minute (L{authsrv.flows.ratelimit.REPORT_WINDOW}), however many are refused."""
    _emit("rate.limited", "requests of {client_id} from {address} to {endpoint} over their rate; retry in"
          " {retry_after}s", endpoint=endpoint, client_id=client_id, address=address, retry_after=retry_after)


def mfa_enrolled(*, sub: str, kind: str) -> None:
    _emit("mfa.enrolled", "{sub} enrolled a {kind} factor", sub=sub, kind=kind)


def mfa_succeeded(*, sub: str, method: str, address: str) -> None:
    _emit("mfa.succeeded", "second factor ({method}) of {sub} from {address}", sub=sub, method=method,
          address=address)


def mfa_failed(*, sub: str, address: str, reason: str) -> None:
    _emit("mfa.failed", "second factor of {sub} refused from {address}: {reason}", sub=sub, address=address,
          reason=reason)


def mfa_enrolment_put_off(*, sub: str, grace_until: int) -> None:
    _emit("mfa.put_off", "{sub} put off enrolling a second factor (grace until {grace_until})", sub=sub,
          grace_until=grace_until)


def recovery_codes_replaced(*, sub: str) -> None:
    _emit("mfa.recovery_codes_replaced", "{sub} has a new set of recovery codes", sub=sub)


def factors_reset(*, sub: str, by: str) -> None:
    _emit("mfa.reset", "second factors of {sub} reset by {by}", sub=sub, by=by)


def passkey_registered(*, sub: str, credential: str, synced: bool) -> None:
    _emit("passkey.registered", "{sub} registered passkey {credential} (synced: {synced})", sub=sub,
          credential=credential, synced=synced)


def passkey_removed(*, sub: str, credential: str) -> None:
    _emit("passkey.removed", "{sub} removed passkey {credential}", sub=sub, credential=credential)


def passkey_succeeded(*, sub: str, credential: str, address: str) -> None:
    _emit("passkey.succeeded", "passkey {credential} of {sub} from {address}", sub=sub, credential=credential,
          address=address)


def passkey_refused(*, sub: str | None, credential: str, address: str, reason: str) -> None:
    _emit("passkey.refused", "passkey {credential} of {sub} refused from {address}: {reason}", sub=sub,
          credential=credential, address=address, reason=reason)


def account_session_ended(*, sub: str, sid: str) -> None:
    _emit("account.session_ended", "{sub} signed out their session {sid} from the account page", sub=sub, sid=sid)


def account_app_revoked(*, sub: str, client_id: str, grants: int) -> None:
    _emit("account.app_revoked", "{sub} revoked {client_id} ({grants} grants and the consent)", sub=sub,
          client_id=client_id, grants=grants)


def password_changed(*, sub: str, sessions_ended: int) -> None:
    _emit("account.password_changed", "{sub} changed their password; {sessions_ended} other sessions ended",
          sub=sub, sessions_ended=sessions_ended)


def password_change_refused(*, sub: str, reason: str) -> None:
    _emit("account.password_change_refused", "password change of {sub} refused: {reason}", sub=sub, reason=reason)
