"""
The device authorization grant (RFC 8628) for TVs and command-line tools,
outside the token endpoint: the device authorization endpoint, which hands a
device its device code and the user code to show, and the verification page
where a person signs in (the same sign-in as for an authorization request,
second factors included), gives the code and approves or denies the device.

User codes are short, so guessing them is throttled like passwords: every
code given counts in the store's login throttle, per client address with a
growing delay and from everywhere together: under one account key for the
whole code space (L{THROTTLE_ACCOUNT}) from a browser not signed in, under
the user's own from one that is, so that guesses from everywhere cannot
keep a signed-in user from connecting a device. A code that turns out live
is forgiven. Codes are stored only as hashes.
"""

from __future__ import annotations

from urllib.parse import urlencode

from attrs import frozen

from authsrv import events
from authsrv.flows.clients import authenticate_client
from authsrv.flows.csrf import session_form_token, session_form_token_valid
from authsrv.flows.interaction import too_many_attempts
from authsrv.flows.outcomes import Browser, DeviceCodeForm, DeviceConsent, Notice, Redirect
from authsrv.protocol.device import (
    DEVICE_CODE_GRANT,
    device_resource,
    device_scope,
    new_user_code,
    shown,
    user_code_key,
)
from authsrv.protocol.discovery import SCOPES
from authsrv.protocol.errors import PageError, UnauthorizedClient
from authsrv.protocol.forwarded import address_key
from authsrv.protocol.scope import scope_text
from authsrv.records import DEVICE_PENDING, Client, DeviceAuthorization, Grant, ThrottlePolicy
from authsrv.store.errors import AlreadyExists
from authsrv.tokens import new_token, token_hash

THROTTLE_ACCOUNT = "device:user-codes"
"""The login throttle's account key of the whole user-code space, for browsers not signed in."""
SAVE_TRIES = 3
"""A new user code that collides with a live one is drawn again, up to this many times."""
WRONG_CODE = "That code is not right, or it was used already or expired. Check the code your device shows."
NOT_A_CODE = "A code has eight letters, like BCDF-GHJK. Check the code your device shows."
USED = "This code was used already or has expired. Start again on your device."
FORM_EXPIRED = "This form has expired. Enter the code from your device again."
SIGNED_OUT = "You are no longer signed in; enter the code from your device again."


@frozen
class DevicePolicy:
    """
    C{[device]}: whether the grant is offered, how long a device code lives,
    the polling interval a device starts with, and how many wrong user codes
    one client address, and everyone together, may give in C{window} seconds.
    """

    enabled: bool = False
    code_ttl: int = 600
    interval: int = 5
    failures_per_address: int = 20
    failures: int = 1000
    window: int = 15 * 60

    @property
    def throttle(self) -> ThrottlePolicy:
        """The throttle's rules for user codes: after five misses an address waits, doubling, as for logins."""
        return ThrottlePolicy(
            failures_per_pair=min(5, self.failures_per_address), failures_per_address=self.failures_per_address,
            failures_per_account=self.failures, window=self.window, max_delay=self.window,
        )


class DeviceAuthorizationFlow:
    """The device authorization endpoint (RFC 8628 section 3.1); C{clients} answers C{get_client}."""

    def __init__(self, *, store, clients, policy: DevicePolicy, issuer: str):
        self._store = store
        self._clients = clients
        self._policy = policy
        self._verification_uri = f"{issuer}/device"

    async def start(
        self, authorization: bytes | None, params: dict[str, str], now: int, address: str,
        checked: Client | None = None,
    ) -> dict:
        """
        The device and user codes, where to enter the latter, and how often to poll.
        C{address}: the device's, for the audit event; C{checked}: the client
        the rate limiter already authenticated from these credentials.
        """
        client = checked or await authenticate_client(self._clients, authorization, params, address=address)
        if DEVICE_CODE_GRANT not in client.grant_types:
            raise UnauthorizedClient(f"this client may not use grant_type {DEVICE_CODE_GRANT}")
        scope = device_scope(params, SCOPES)
        resource = device_resource(client, params)
        policy = self._policy
        device_code = new_token()
        for attempt in range(SAVE_TRIES):
            user_code = new_user_code()
            try:
                await self._store.save_device_authorization(DeviceAuthorization(
                    device_code_hash=token_hash(device_code), user_code_hash=_user_code_hash(user_code_key(user_code)),
                    client_id=client.client_id, scope=scope, resource=resource, created_at=now,
                    expires_at=now + policy.code_ttl, poll_interval=policy.interval,
                ))
                break
            except AlreadyExists:
                if attempt == SAVE_TRIES - 1:
                    raise
        events.device_requested(client_id=client.client_id, scope=scope_text(scope), address=address)
        return {
            "device_code": device_code,
            "user_code": user_code,
            "verification_uri": self._verification_uri,
            "verification_uri_complete": f"{self._verification_uri}?{urlencode({'user_code': user_code})}",
            "expires_in": policy.code_ttl,
            "interval": policy.interval,
        }


def _user_code_hash(key: str | None) -> str:
    assert key is not None, "a user code made here is well-formed"
    return token_hash(key)


def _form_purpose(user_code_hash: str) -> bytes:
    """The approval form's CSRF token is bound to the session and to the one code it shows."""
    return b"device " + user_code_hash.encode()


class DeviceVerification:
    """
    The verification page (RFC 8628 section 3.3). C{interaction} is the
    L{authsrv.flows.interaction.InteractionFlow} that signs users in;
    C{limits} gives the grant's absolute lifetime.
    """

    def __init__(self, *, store, clients, identity, interaction, policy: DevicePolicy, limits, issuer: str):
        self._store = store
        self._clients = clients
        self._identity = identity
        self._interaction = interaction
        self._policy = policy
        self._limits = limits
        self._page = f"{issuer}/device"
        self._account = f"{issuer}/account"

    async def page(self, user_code: str | None, browser: Browser, address: str,
                   now: int) -> DeviceCodeForm | DeviceConsent | Redirect:
        """
        Without a code, the form asking for one; with a live one, the
        sign-in if needed and then the approval form.
        """
        if not user_code:
            return DeviceCodeForm()
        signed_in = await self._interaction.live_session(browser.session, now)
        found = await self._live_code(user_code, address, now, None if signed_in is None else signed_in.sub)
        if isinstance(found, DeviceCodeForm):
            return found
        key, device, client = found
        session = await self._interaction.device_session(client, self._return_to(key), browser, signed_in, address,
                                                          now)
        if isinstance(session, Redirect):
            return session
        assert browser.session is not None, "a live session came from the browser's cookie"
        user = await self._identity.user_by_id(session.sub)
        return DeviceConsent(
            client_name=client.name or client.client_id, user_label=user.login if user else session.sub,
            scope=tuple(s for s in SCOPES if s in device.scope), user_code=shown(key),
            csrf=session_form_token(browser.session, _form_purpose(device.user_code_hash)),
        )

    async def submit(self, form: dict[str, str] | None, browser: Browser, address: str,
                     now: int) -> DeviceCodeForm | Notice | Redirect:
        """The approval form posted: approve or deny the device, once."""
        form = form or {}
        key = user_code_key(form.get("user_code", ""))
        if key is None or form.get("action") not in ("approve", "deny"):
            raise PageError(400, "Device not connected", FORM_EXPIRED)
        session = await self._interaction.live_session(browser.session, now)
        if session is None:
            raise PageError(400, "Signed out", SIGNED_OUT)
        if not session_form_token_valid(browser.session, _form_purpose(token_hash(key)), form.get("csrf")):
            raise PageError(403, "Device not connected", FORM_EXPIRED)
        found = await self._live_code(key, address, now, session.sub)
        if isinstance(found, DeviceCodeForm):
            return found
        _, device, client = found
        stepped = await self._interaction.device_session(client, self._return_to(key), browser, session, address, now)
        if isinstance(stepped, Redirect):
            return stepped
        if form["action"] == "deny":
            if not await self._store.decide_device_authorization(device.user_code_hash, session.sub, None, now):
                raise PageError(409, "Code used", USED)
            events.device_denied(sub=session.sub, client_id=client.client_id, address=address)
            return Notice(200, "Device not connected",
                          f"{client.name or client.client_id} on your device gets no access.")
        grant = Grant(
            grant_id=new_token(16), client_id=client.client_id, sub=session.sub, scope=device.scope,
            resource=device.resource, auth_time=session.auth_time, created_at=now,
            expires_at=now + self._limits.refresh_token_absolute_ttl, amr=session.amr, acr=session.acr,
        )
        if not await self._store.decide_device_authorization(device.user_code_hash, session.sub, grant, now):
            raise PageError(409, "Code used", USED)
        events.device_approved(sub=session.sub, client_id=client.client_id, grant_id=grant.grant_id,
                               scope=scope_text(device.scope), address=address)
        return Notice(200, "Device connected",
                      f"{client.name or client.client_id} is signed in on your device. You can close this page.")

    def _return_to(self, key: str) -> str:
        return f"{self._page}?{urlencode({'user_code': shown(key)})}"

    async def _live_code(self, user_code: str, address: str, now: int, sub: str | None = None):
        """
        The code's stored form, its pending request and client; or the code
        form again saying why not, also when the client may no longer use
        the grant (its device could not get the tokens). Every well-formed
        code counts in the throttle first, under the signed-in user C{sub}
        if any; a live one is forgiven.
        """
        key = user_code_key(user_code)
        if key is None:
            return DeviceCodeForm(200, user_code[:16], NOT_A_CODE)
        account = THROTTLE_ACCOUNT if sub is None else f"{THROTTLE_ACCOUNT}:{sub}"
        decision = await self._store.attempt(account, address_key(address), None, self._policy.throttle, now)
        if decision.wait is not None:
            events.device_code_failed(address=address, reason=f"throttled for {decision.wait}s", sub=sub)
            message = too_many_attempts(decision.wait) + ("" if sub is not None else (
                f" Or sign in first at {self._account}: then only your own attempts count."))
            return DeviceCodeForm(429, shown(key), message, decision.wait)
        device = await self._store.find_device_authorization(token_hash(key), now)
        client = None if device is None else await self._clients.get_client(device.client_id)
        if device is None or device.status != DEVICE_PENDING or client is None or (
                DEVICE_CODE_GRANT not in client.grant_types):
            events.device_code_failed(address=address, reason="unknown, used or expired code", sub=sub)
            return DeviceCodeForm(200, shown(key), WRONG_CODE)
        await self._store.forgive(decision.ticket)
        return key, device, client
