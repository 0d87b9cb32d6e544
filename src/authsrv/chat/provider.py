"""
The chat platform's OAuth 2 client: authorize URL, code exchange, refresh
and the current user's id (Discord by default; any provider with the same
endpoints works, such as L{authsrv.testing.fake_chat}).

Every call is bounded by C{[chat] timeout} as a whole (name lookup,
connection, answer and body) and reads at most L{MAX_BODY} bytes of body;
its connection (L{PlatformClient}) is aborted at that timeout and once it
has received L{RECEIVE_LIMIT} bytes, headers included. A provider that
cannot be reached, times out, answers 5xx or 429, sends too much, or answers
something that is not the OAuth JSON it should, is
L{ChatProviderUnavailable}; a refresh token it rejects is
L{ChatRefreshRefused}. Tokens are never logged: only statuses and the
provider's error codes.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import treq
from attrs import field, frozen
from treq.client import HTTPClient
from twisted.internet import defer, error
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.web.client import (
    Agent,
    RequestTransmissionFailed,
    ResponseFailed,
    ResponseNeverReceived,
)
from zope.interface import implementer

from authsrv.chat.config import ChatConfig
from authsrv.chat.errors import ChatError, ChatProviderUnavailable, ChatRefreshRefused
from authsrv.flows.backchannel import RESPONSE_BYTES, PinnedEndpoints, ReceiveLimit
from authsrv.hostlookup import HostLookups, LookupsBusy, addresses_of
from authsrv.interfaces import IChatProvider
from authsrv.protocol import jsontext
from authsrv.protocol.urls import with_query

MAX_BODY = 64 * 1024
RECEIVE_LIMIT = MAX_BODY + RESPONSE_BYTES
"""What one connection to the platform may receive: an answer's body, and its headers and TLS beside it."""
LOOKUP_THREADS = 2
"""The threads of the platform's own pool that look its host name up (L{PlatformClient})."""
LOOKUPS_WAITING = 16
"""
How many of the platform's lookups may wait for one of those threads; a
call beyond them, while its name servers hang, is unavailable at once.
"""
DEFAULT_EXPIRES_IN = 3600
"""RFC 6749 makes expires_in optional; a provider that omits it is taken to mean an hour."""
MAX_EXPIRES_IN = 365 * 86400
"""
The longest access token lifetime believed: a provider's larger expires_in
is taken as this, since its answer may carry a rotated refresh token that
must be kept, and a lifetime of centuries fits neither the store nor a date.
"""

_NETWORK_ERRORS = (
    error.ConnectError,
    error.ConnectingCancelledError,
    error.ConnectionLost,
    error.DNSLookupError,
    ResponseFailed,
    ResponseNeverReceived,
    RequestTransmissionFailed,
    defer.TimeoutError,
    defer.CancelledError,
    OSError,
    LookupsBusy,
)

log = Logger()


class ChatCodeRejected(ChatError):
    """The provider refused the authorization code: the user starts linking again."""

    code = "chat_code_rejected"
    status = 400


class _TooLarge(Exception):
    pass


@frozen
class ProviderTokens:
    """
    A token response; C{refresh_token} is None when the provider sent none,
    C{scope} when a refresh answer named none.
    """

    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)
    scope: str | None
    expires_in: int


class PlatformClient:
    """
    The HTTP client the provider reaches the platform with (treq's
    C{request}), bounded as the server's other outbound requests are
    (L{authsrv.remote_documents}): the host is looked up by C{lookups}, on a
    thread pool of the platform's own, so that a platform whose name servers
    never answer holds no thread another lookup needs (the reactor's pool
    also hashes passwords); each request goes on a connection of its own to
    an address found (L{PinnedEndpoints}: the name is still sent as Host
    and HTTPS checks the certificate against it), the next one tried when
    one refuses the connection, aborted C{timeout} seconds after it is made,
    on C{clock}, and once it has received L{RECEIVE_LIMIT} bytes. The
    platform, or whoever answers in its name, can then neither send headers
    without end, which Twisted's HTTP client would all keep, nor hold a
    socket by dripping an answer after the call has given up on it.
    """

    def __init__(self, reactor, lookups: HostLookups, timeout: float, *, clock=None):
        self._reactor = reactor
        self._lookups = lookups
        self._timeout = timeout
        self._clock = clock or reactor

    async def request(self, method: str, url: str, **kwargs):
        *others, last = await addresses_of(urlsplit(url).hostname or "", self._lookups)
        for address in others:
            try:
                return await self._request_at(address, method, url, **kwargs)
            except error.ConnectError:
                pass  # nothing was sent: another address of the name may answer
        return await self._request_at(last, method, url, **kwargs)

    async def _request_at(self, address: str, method: str, url: str, **kwargs):
        limit = ReceiveLimit(RECEIVE_LIMIT)
        agent = Agent.usingEndpointFactory(self._reactor, PinnedEndpoints(
            self._reactor, address, lifetime=self._timeout, clock=self._clock, limit=limit))
        try:
            return await HTTPClient(agent).request(method, url, **kwargs)
        except Exception:
            if limit.exceeded:
                raise _TooLarge() from None
            raise

@implementer(IChatProvider)
class ChatProvider:
    """
    One provider's endpoints. C{http} is a L{treq.client.HTTPClient} (or
    anything with its C{request} method, such as L{treq.testing.StubTreq});
    the reactor times each call out. The config must name a C{client_id}:
    without one there is no client to speak for.
    """

    def __init__(self, reactor, http, config: ChatConfig):
        if config.client_id is None:
            raise ValueError("a chat provider client needs the [chat] client_id")
        self._reactor = reactor
        self._http = http
        self._config = config
        self._client_id = config.client_id

    @property
    def name(self) -> str:
        return self._config.provider

    def authorize_url(self, state: str, code_challenge: str | None, redirect_uri: str) -> str:
        """Where the browser goes to approve the link; PKCE S256 when a challenge is given."""
        params = {
            "response_type": "code",
            "client_id": self._client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(self._config.scopes),
            "state": state,
        }
        if code_challenge is not None:
            params["code_challenge"] = code_challenge
            params["code_challenge_method"] = "S256"
        return with_query(self._config.authorize_url, params)

    async def exchange_code(self, code: str, code_verifier: str | None, redirect_uri: str) -> ProviderTokens:
        """The tokens for an authorization code; L{ChatCodeRejected} if it is refused."""
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri}
        if code_verifier is not None:
            form["code_verifier"] = code_verifier
        status, body = await self._call("POST", self._config.token_url, data=self._client_form(form))
        if status in (400, 401):
            reason = _error_code(body)
            log.warn("chat provider refused an authorization code: {status} {reason}", status=status, reason=reason)
            raise ChatCodeRejected(f"the chat platform refused the authorization code ({reason})")
        return self._tokens(status, body, " ".join(self._config.scopes))

    async def refresh(self, refresh_token: str) -> ProviderTokens:
        """
        New tokens for a refresh token; their C{scope} is None when the
        answer names none, meaning unchanged (RFC 6749 section 5.1).
        """
        form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
        status, body = await self._call("POST", self._config.token_url, data=self._client_form(form))
        if status in (400, 401):
            reason = _error_code(body)
            log.warn("chat provider refused a refresh: {status} {reason}", status=status, reason=reason)
            if reason == "invalid_grant":
                raise ChatRefreshRefused("the chat platform refused the stored refresh token; link the account again")
            raise ChatProviderUnavailable(f"the chat platform refused the refresh request ({reason})")
        return self._tokens(status, body, None)

    async def current_user(self, access_token: str) -> str:
        """The provider's id of the user an access token belongs to."""
        status, body = await self._call(
            "GET", self._config.user_url, headers={"authorization": f"Bearer {access_token}"}
        )
        if status != 200:
            log.warn("chat provider did not name the current user: {status}", status=status)
            raise ChatProviderUnavailable(f"the chat platform answered {status} for the current user")
        found = body.get("id")
        user_id = str(found) if isinstance(found, int) and not isinstance(found, bool) else found
        if not isinstance(user_id, str) or not user_id or len(user_id) > 256:
            raise ChatProviderUnavailable("the chat platform's user answer has no id")
        return user_id

    def _client_form(self, form: dict[str, str]) -> dict[str, str]:
        """client_secret_post: the client's credentials in the form body."""
        form["client_id"] = self._client_id
        if self._config.client_secret is not None:
            form["client_secret"] = self._config.client_secret
        return form

    def _tokens(self, status: int, body: dict, default_scope: str | None) -> ProviderTokens:
        if status != 200:
            log.warn("chat provider token endpoint answered {status}", status=status)
            raise ChatProviderUnavailable(f"the chat platform's token endpoint answered {status}")
        access, refresh = body.get("access_token"), body.get("refresh_token")
        scope, expires_in = body.get("scope", default_scope), body.get("expires_in", DEFAULT_EXPIRES_IN)
        if (
            not isinstance(access, str) or not access
            or not (refresh is None or isinstance(refresh, str) and refresh)
            or not (scope is None or isinstance(scope, str))
            or not isinstance(expires_in, int) or isinstance(expires_in, bool) or expires_in <= 0
            or str(body.get("token_type", "bearer")).lower() != "bearer"
        ):
            raise ChatProviderUnavailable("the chat platform's token answer is malformed")
        return ProviderTokens(access, refresh, scope, min(expires_in, MAX_EXPIRES_IN))

    async def revoke(self, token: str, token_type_hint: str) -> None:
        """
        RFC 7009 revocation of a token this client holds; nothing without a
        configured revocation endpoint. Its answer's body means nothing (RFC
        7009 section 2.2): any status but 200 is L{ChatProviderUnavailable}.
        """
        url = self._config.revocation_url
        if url is None:
            return
        form = self._client_form({"token": token, "token_type_hint": token_type_hint})
        status, _ = await self._raw_call("POST", url, data=form)
        if status != 200:
            log.warn("chat provider refused a revocation: {status}", status=status)
            raise ChatProviderUnavailable(f"the chat platform answered {status} to a revocation")

    async def _call(self, method: str, url: str, **kwargs) -> tuple[int, dict]:
        """(status, JSON object body) of one request, the whole of it within the timeout."""
        status, raw = await self._raw_call(method, url, **kwargs)
        try:
            body = jsontext.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            log.warn("chat provider answered {status} without a JSON object at {url}", status=status, url=_origin(url))
            raise ChatProviderUnavailable("the chat platform's answer is not JSON")
        return status, body

    async def _raw_call(self, method: str, url: str, **kwargs) -> tuple[int, bytes]:
        """(status, body) of one request within the timeout; 5xx and 429 are L{ChatProviderUnavailable}."""
        d = Deferred.fromCoroutine(self._exchange(method, url, **kwargs))
        d.addTimeout(self._config.timeout, self._reactor)
        try:
            status, raw = await d
        except _NETWORK_ERRORS as e:
            log.warn("chat provider unreachable at {url}: {error}", url=_origin(url), error=type(e).__name__)
            raise ChatProviderUnavailable("the chat platform cannot be reached; try again") from None
        except _TooLarge:
            log.warn("chat provider sent more than allowed at {url}; the connection is cut", url=_origin(url))
            raise ChatProviderUnavailable("the chat platform's answer is too large") from None
        if status >= 500 or status == 429:
            log.warn("chat provider failed at {url}: {status}", url=_origin(url), status=status)
            raise ChatProviderUnavailable(f"the chat platform answered {status}; try again")
        return status, raw

    async def _exchange(self, method: str, url: str, **kwargs) -> tuple[int, bytes]:
        headers = {"accept": "application/json", "user-agent": "authsrv", **kwargs.pop("headers", {})}
        response = await self._http.request(
            method, url, headers=headers, allow_redirects=False, unbuffered=True, **kwargs
        )
        chunks: list[bytes] = []
        received = [0]

        def collect(data: bytes) -> None:
            received[0] += len(data)
            if received[0] > MAX_BODY:
                raise _TooLarge()
            chunks.append(data)

        await treq.collect(response, collect)
        return response.code, b"".join(chunks)


async def revoke_tokens(provider: IChatProvider, whose: str, access_token: str, refresh_token: str | None) -> None:
    """
    Best effort, so that tokens no one keeps stop working: a failure (each
    call bounded by the provider's timeout) is only logged, by its kind and
    C{whose} they were, never with the token. Never fails, so that a caller
    may leave it running after its answer.
    """
    for token, hint in ((access_token, "access_token"), (refresh_token, "refresh_token")):
        if token is None:
            continue
        try:
            await provider.revoke(token, hint)
        except Exception as e:
            log.warn("could not revoke {whose} {hint} at {provider}: {error}",
                     whose=whose, hint=hint, provider=provider.name, error=type(e).__name__)


_ERROR_CODE = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]{1,64}")
"""An error code as RFC 6749 section 5.2 allows it (printable ASCII but '"' and '\\'), at most 64 characters."""


def _error_code(body: dict) -> str:
    """
    The OAuth error code of an error answer, safe to log and to show: one
    of RFC 6749's characters alone, so the platform (or whoever answers in
    its name) can neither write lines of its own into the log nor send
    terminal controls (a newline, ESC) into it or onto the user's page.
    """
    code = body.get("error")
    if not isinstance(code, str):
        return "no error code"
    return code if _ERROR_CODE.fullmatch(code) else "a malformed error code"


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"
