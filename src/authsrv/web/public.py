"""
The public site: every endpoint relying parties and browsers reach, as one
Klein object built with the flows it hands work to. Routes read the
request, call one flow and render its answer; flows decide. Failures render
in one place each: L{OAuthError} as RFC 6749 JSON, L{PageError} as a page,
an outage as 503 in the shape the caller reads.

Token, pushed authorization requests, revocation and UserInfo allow any
origin: single-page apps call them from the browser, and none of them relies
on a cookie, so CORS grants a page nothing its client credentials or bearer
token would not. Introspection is for servers only.
"""

from __future__ import annotations


from twisted.logger import Logger
from twisted.web.template import tags
from werkzeug.exceptions import MethodNotAllowed, NotFound

from authsrv.config import ISSUER_PATH
from authsrv.flows.account import TOTP_SET_UP, AccountView, PasswordRefused
from authsrv.flows.link import link_token, link_token_valid, unlink_token, unlink_token_valid
from authsrv.flows.mfa import ENROLMENT_TTL, SHOWN_TTL
from authsrv.flows.outcomes import (
    DeviceCodeForm,
    EnrolmentForm,
    LoginForm,
    LogoutConfirmation,
    NewRecoveryCodes,
    Notice,
    Redirect,
)
from authsrv.flows.ratelimit import ClientRateLimits, EndpointLimit, RateLimited
from authsrv.identity.errors import BackendUnavailable
from authsrv.protocol import jsontext
from authsrv.protocol.bearer import access_credential
from authsrv.protocol.errors import (
    InvalidClientMetadata,
    InvalidRequest,
    OAuthError,
    PageError,
    TemporarilyUnavailable,
)
from authsrv.protocol.params import page_params
from authsrv.protocol.pushed import push_params
from authsrv.records import Client
from authsrv.store.errors import StoreUnavailable
from authsrv.web.account_pages import account_page
from authsrv.web.cookies import ENROLMENT_COOKIE, RECOVERY_COOKIE
from authsrv.web.device_pages import device_code_page, device_consent_page
from authsrv.web.failures import oauth_server_error, unforeseen_in_klein
from authsrv.web.forms import (
    DEVICE_RESOURCES,
    TOKEN_RESOURCES,
    client_address_of,
    code_form,
    form_args,
    one_resource_form,
    page_form,
    passkey_answer_form,
    password_change_form,
    sign_in_form,
    token_form_params,
    userinfo_form_token,
)
from authsrv.web.headers import (
    RETRY_AFTER,
    allow_any_origin,
    allow_browser_clients,
    json_body,
    jwt_body,
    method_not_allowed,
    oauth_error,
)
from authsrv.web.interaction_pages import (
    consent_page,
    enrolment_page,
    login_page,
    logout_confirmation_page,
    recovery_codes_page,
    second_factor_page,
)
from authsrv.web.limits import PAGE_PREFIXES, allow_browsers_at
from authsrv.web.pages import error_page, render_page
from authsrv.web.quiet import QuietWarnings
from authsrv.web.routes import Endpoint, ExactPaths, RoutedKlein

JSON_ENDPOINTS = (
    b"/oauth2/token", b"/oauth2/par", b"/oauth2/userinfo", b"/oauth2/introspect", b"/oauth2/revoke",
    b"/oauth2/device-authorization",
)
"""Paths whose callers read JSON; every other route that uses the store is a page."""
LINK_PATH = ISSUER_PATH + "/link/chat"
ACCOUNT_PATH = ISSUER_PATH + "/account"
ACCOUNT_TOTP_PATH = ACCOUNT_PATH + "/mfa/totp"
ACCOUNT_RECOVERY_PATH = ACCOUNT_PATH + "/mfa/recovery"
REGISTER_PATH = ISSUER_PATH + "/oauth2/register"
TOKEN_PATH = ISSUER_PATH + "/oauth2/token"
INTROSPECT_PATH = ISSUER_PATH + "/oauth2/introspect"
USERINFO_PATH = ISSUER_PATH + "/oauth2/userinfo"
AUTHORIZE_PATH = ISSUER_PATH + "/oauth2/authorize"
LOGIN_PATH = ISSUER_PATH + "/login"


def _reads_json(request) -> bool:
    """Whether the route's caller reads JSON (an OAuth endpoint, client registration) rather than a page."""
    return request.path.endswith(JSON_ENDPOINTS) or REGISTER_PATH.encode() in request.path


def _wrong_method(request, allow: bytes) -> bytes:
    """
    405 with C{Allow}; at a page's address, a page: a browser gets there
    with a GET when the address of a page that answered a form (the login
    page after a passkey, the account page after an action) is opened again.
    At an endpoint browser-based clients call, any origin may read it, as
    it reads the endpoint's answers.
    """
    allow_browsers_at(request)
    if not request.path.startswith(PAGE_PREFIXES):
        return method_not_allowed(request, allow)
    request.setHeader(b"allow", allow)
    return error_page(request, 405, "Page not available",
                      "This address cannot be opened this way. Go back to the application and start again.")


def _preflight(request, methods: bytes) -> bytes:
    allow_browser_clients(request)
    request.setHeader(b"access-control-allow-methods", methods)
    request.setHeader(b"access-control-allow-headers", b"Authorization, Content-Type, DPoP")
    request.setHeader(b"access-control-max-age", b"86400")
    request.setResponseCode(204)
    return b""


def _cannot_check() -> PageError:
    return PageError(503, "Try again later", "The service cannot check your account right now.")


def _metadata(request):
    """A registration request's JSON body (RFC 7591 section 3.1), or L{InvalidClientMetadata}."""
    content_type = (request.getHeader(b"content-type") or b"").split(b";")[0].strip().lower()
    if content_type != b"application/json":
        raise InvalidClientMetadata("send the client metadata as a JSON object (application/json)")
    try:
        return jsontext.loads(request.content.read())
    except jsontext.NotJSONText as e:
        raise InvalidClientMetadata(f"the client metadata cannot be read: {e}") from None


class PublicSite:
    """
    C{flows} has the attributes C{interaction}, C{token}, C{pushed} (None
    when pushed authorization requests are not offered), C{userinfo},
    C{introspection}, C{revocation}, C{end_session}, C{account} (the user's
    own second factors), C{account_page} (the account page's actions) and
    C{linking} (None when no chat provider client is configured),
    C{device} and C{device_verification} (None when the device grant is off);
    C{readiness} is an L{authsrv.flows.readiness.Readiness}; C{trusted_proxies}
    are the peers whose forwarding headers name the client's address;
    C{rates} counts back-channel requests against their client's rate.
    """

    app = RoutedKlein()
    log = Logger()

    def __init__(self, *, clock, issuer: str, cookies, flows, readiness, rates: ClientRateLimits,
                 trusted_proxies=()):
        self._rates = rates
        self._trusted_proxies = trusted_proxies
        self._clock = clock
        self._issuer = issuer
        self._cookies = cookies
        self._flows = flows
        self._readiness = readiness
        self._quiet = QuietWarnings(self.log, clock)

    def resource(self) -> ExactPaths:
        """The hottest routes as plain leaves by their path (L{Endpoint}), the rest through Klein."""
        return ExactPaths({
            TOKEN_PATH.encode(): self._endpoint(TOKEN_PATH, {b"POST": self.token, b"OPTIONS": self.token_preflight},
                                                b"POST, OPTIONS"),
            INTROSPECT_PATH.encode(): self._endpoint(INTROSPECT_PATH, {b"POST": self.introspection}, b"POST"),
            USERINFO_PATH.encode(): self._endpoint(USERINFO_PATH, {
                b"GET": self.userinfo, b"HEAD": self.userinfo, b"POST": self.userinfo,
                b"OPTIONS": self.userinfo_preflight,
            }, b"GET, HEAD, POST, OPTIONS"),
            AUTHORIZE_PATH.encode(): self._endpoint(AUTHORIZE_PATH, {
                b"GET": self.authorize, b"HEAD": self.authorize, b"POST": self.authorize,
            }, b"GET, HEAD, POST"),
            LOGIN_PATH.encode(): self._endpoint(LOGIN_PATH, {
                b"GET": self.login, b"HEAD": self.login, b"POST": self.login_submitted,
            }, b"GET, HEAD, POST"),
        }, self.app.resource())

    def _endpoint(self, route: str, handlers, allow: bytes) -> Endpoint:
        return Endpoint(route, handlers, lambda request: _wrong_method(request, allow), self._server_error,
                        self._refusal)

    def _now(self) -> int:
        return int(self._clock.seconds())

    async def _count(self, request, limit: EndpointLimit, params: dict[str, str],
                     address: str | None = None) -> Client | None:
        """
        Count a client's request against its rate before any work; raises
        L{RateLimited}. Fires with the client if its credentials need no
        second check (L{ClientRateLimits.client_request}). C{address}: the
        client's, for a route that has it already (its audit events name
        it), so that it is found once; else it is found only if the count
        needs it.
        """
        return await self._rates.client_request(
            limit, request.getHeader(b"authorization"), params,
            (lambda: client_address_of(request, self._trusted_proxies)) if address is None else (lambda: address),
        )

    def _registration(self, request):
        """The registration flow, or 404 when registration is off (as if the endpoint did not exist)."""
        if self._flows.registration is None:
            raise NotFound()
        allow_browser_clients(request)
        return self._flows.registration

    def _login_page(self, request, form: LoginForm) -> bytes:
        """The login form, posting to the login endpoint, with the cookies it sets (a new browser's device secret)."""
        self._cookies.apply(request, form.cookies)
        return login_page(request, f"{self._issuer}/login", form)

    def _answer(self, request, outcome: Redirect | Notice) -> bytes:
        """A browser flow's redirect or notice, with the cookies it sets."""
        self._cookies.apply(request, outcome.cookies)
        if isinstance(outcome, Notice):
            return render_page(request, outcome.status, outcome.title, tags.p(outcome.message))
        request.setResponseCode(outcome.status)
        request.setHeader(b"location", outcome.location.encode())
        request.setHeader(b"cache-control", b"no-store")
        return b""

    # --- discovery and health ------------------------------------------------

    @app.route("/.well-known/openid-configuration", methods=["GET", "HEAD"])
    def root_discovery(self, request):
        """The contract's redirect from the host root to the issuer's document."""
        allow_any_origin(request)
        request.setResponseCode(301)
        request.setHeader(b"location", f"{self._issuer}/.well-known/openid-configuration".encode())
        request.setHeader(b"cache-control", b"public, max-age=86400")
        return b""

    @app.route("/healthz", methods=["GET", "HEAD"])
    def liveness(self, request):
        """Alive: the process answers HTTP. Nothing else is checked."""
        request.setHeader(b"cache-control", b"no-store")
        return json_body(request, 200, {"status": "ok"})

    @app.route("/readyz", methods=["GET", "HEAD"])
    async def readiness(self, request):
        """
        Ready (200), degraded (200: an identity backend is down, another
        answers) or not (503): a load balancer takes the instance out of
        rotation then. The README documents the bodies.
        """
        request.setHeader(b"cache-control", b"no-store")
        status, body = await self._readiness.check()
        return json_body(request, status, body)

    # --- the relying parties' back channel -----------------------------------

    async def token(self, request):
        allow_browser_clients(request)
        params = one_resource_form(request, TOKEN_RESOURCES)
        address = client_address_of(request, self._trusted_proxies)
        checked = await self._count(request, self._rates.token, params, address)
        response = await self._flows.token.token(
            request.getHeader(b"authorization"), params, self._now(), request.requestHeaders.getRawHeaders(b"dpop"),
            checked, address)
        return json_body(request, 200, response, no_store=True)

    def token_preflight(self, request):
        return _preflight(request, b"POST, OPTIONS")

    @app.route(ISSUER_PATH + "/oauth2/par", methods=["POST"])
    async def pushed_request(self, request):
        """
        RFC 9126: 201 with the request_uri, counted like the token endpoint;
        404 when not offered. Any origin, as at the token endpoint: a
        single-page app pushes its request (with a DPoP proof, RFC 9449
        section 10.1) before sending the browser on.
        """
        pushed = self._pushed()
        allow_browser_clients(request)
        args = form_args(request)
        address = client_address_of(request, self._trusted_proxies)
        checked = await self._count(request, self._rates.pushed, push_params(args), address)
        response = await pushed.push(request.getHeader(b"authorization"), args, self._now(), address,
                                     request.requestHeaders.getRawHeaders(b"dpop"), checked)
        return json_body(request, 201, response, no_store=True)

    @app.route(ISSUER_PATH + "/oauth2/par", methods=["OPTIONS"])
    def pushed_request_preflight(self, request):
        self._pushed()
        return _preflight(request, b"POST, OPTIONS")

    def _pushed(self):
        """The pushed requests flow, or 404 when they are not offered (as if the endpoint did not exist)."""
        if self._flows.pushed is None:
            raise NotFound()
        return self._flows.pushed

    async def userinfo(self, request):
        """GET and POST (OIDC Core 5.3.1), and HEAD as every GET route of the site answers it."""
        allow_browser_clients(request)
        self._rates.userinfo_request(client_address_of(request, self._trusted_proxies))
        scheme, access_token = access_credential(request.getHeader(b"authorization"), userinfo_form_token(request))
        answer = await self._flows.userinfo.userinfo(
            access_token, self._now(), scheme=scheme, dpop=request.requestHeaders.getRawHeaders(b"dpop"),
            method=request.method.decode("ascii"),
        )
        if isinstance(answer, str):
            return jwt_body(request, answer)
        return json_body(request, 200, answer, no_store=True)

    def userinfo_preflight(self, request):
        return _preflight(request, b"GET, POST, OPTIONS")

    async def introspection(self, request):
        params = token_form_params(request)
        checked = await self._count(request, self._rates.introspection, params)
        answer = await self._flows.introspection.introspect(
            request.getHeader(b"authorization"), params, self._now(), checked)
        return json_body(request, 200, answer, no_store=True)

    @app.route(ISSUER_PATH + "/oauth2/revoke", methods=["POST"])
    async def revocation(self, request):
        allow_browser_clients(request)
        params = token_form_params(request)
        address = client_address_of(request, self._trusted_proxies)
        checked = await self._count(request, self._rates.revocation, params, address)
        await self._flows.revocation.revoke(request.getHeader(b"authorization"), params, self._now(), checked,
                                            address)
        request.setHeader(b"cache-control", b"no-store")
        request.defaultContentType = None  # RFC 7009 section 2.2: the status says it all; no body, so no type
        return b""

    @app.route(ISSUER_PATH + "/oauth2/revoke", methods=["OPTIONS"])
    def revocation_preflight(self, request):
        return _preflight(request, b"POST, OPTIONS")

    @app.route(ISSUER_PATH + "/oauth2/device-authorization", methods=["POST"])
    async def device_authorization(self, request):
        """
        RFC 8628 section 3.1: counted against the client's token endpoint
        rate, and a public client's against its address's waiting ones.
        """
        if self._flows.device is None:
            raise NotFound()
        params = one_resource_form(request, DEVICE_RESOURCES)
        address = client_address_of(request, self._trusted_proxies)
        checked = await self._rates.device_request(request.getHeader(b"authorization"), params, lambda: address)
        response = await self._flows.device.start(request.getHeader(b"authorization"), params, self._now(), address,
                                                  checked)
        return json_body(request, 200, response, no_store=True)

    # --- clients that register themselves (RFC 7591, RFC 7592) ------------------

    @app.route(REGISTER_PATH, methods=["POST"])
    async def register(self, request):
        registration = self._registration(request)
        answer = await registration.register(_metadata(request), request.getHeader(b"authorization"),
                                             client_address_of(request, self._trusted_proxies))
        return json_body(request, 201, answer, no_store=True)

    @app.route(REGISTER_PATH + "/<client_id>", methods=["PUT"])
    async def registered_client_replaced(self, request, client_id):
        registration = self._registration(request)
        answer = await registration.update(client_id, _metadata(request), request.getHeader(b"authorization"),
                                           client_address_of(request, self._trusted_proxies))
        return json_body(request, 200, answer, no_store=True)

    @app.route(REGISTER_PATH + "/<client_id>", methods=["GET"])
    async def registered_client(self, request, client_id):
        answer = await self._registration(request).read(
            client_id, request.getHeader(b"authorization"), client_address_of(request, self._trusted_proxies))
        return json_body(request, 200, answer, no_store=True)

    @app.route(REGISTER_PATH + "/<client_id>", methods=["DELETE"])
    async def registered_client_deleted(self, request, client_id):
        await self._registration(request).delete(
            client_id, request.getHeader(b"authorization"), client_address_of(request, self._trusted_proxies))
        request.setHeader(b"cache-control", b"no-store")
        request.setResponseCode(204)
        return b""

    @app.route(REGISTER_PATH, methods=["OPTIONS"])
    def register_preflight(self, request):
        self._registration(request)
        return _preflight(request, b"POST, OPTIONS")

    @app.route(REGISTER_PATH + "/<client_id>", methods=["OPTIONS"])
    def registered_client_preflight(self, request, client_id):
        self._registration(request)
        return _preflight(request, b"GET, PUT, DELETE, OPTIONS")

    # --- the browser: authorize, login, consent, end-session ------------------

    def _device_verification(self):
        if self._flows.device_verification is None:
            raise PageError(404, "Not available", "This service does not connect devices.")
        return self._flows.device_verification

    @app.route(ISSUER_PATH + "/device", methods=["GET"])
    async def device(self, request):
        """The verification page (RFC 8628 section 3.3); C{user_code} in the query skips typing it."""
        verification = self._device_verification()
        try:
            user_code = page_params(request.args).get("user_code")
        except InvalidRequest as e:
            raise PageError(400, "Connect a device", e.description) from None
        outcome = await verification.page(
            user_code, self._cookies.browser(request), client_address_of(request, self._trusted_proxies), self._now()
        )
        if isinstance(outcome, Redirect):
            return self._answer(request, outcome)
        if isinstance(outcome, DeviceCodeForm):
            return device_code_page(request, f"{self._issuer}/device", outcome)
        return device_consent_page(request, f"{self._issuer}/device", outcome)

    @app.route(ISSUER_PATH + "/device", methods=["POST"])
    async def device_submitted(self, request):
        outcome = await self._device_verification().submit(
            page_form(request), self._cookies.browser(request), client_address_of(request, self._trusted_proxies),
            self._now(),
        )
        if isinstance(outcome, DeviceCodeForm):
            return device_code_page(request, f"{self._issuer}/device", outcome)
        return self._answer(request, outcome)

    async def authorize(self, request):
        """RFC 6749 section 4.1.1 (GET, and POST as OIDC Core 3.1.2.1 allows)."""
        address = client_address_of(request, self._trusted_proxies)
        outcome = await self._flows.interaction.authorize(
            request.args, self._cookies.browser(request), address, self._now()
        )
        if isinstance(outcome, LoginForm):
            return self._login_page(request, outcome)
        return self._answer(request, outcome)

    async def login(self, request):
        form = await self._flows.interaction.login_form(page_form(request), self._cookies.browser(request),
                                                        self._now())
        return self._login_page(request, form)

    async def login_submitted(self, request):
        address = client_address_of(request, self._trusted_proxies)
        outcome = await self._flows.interaction.submit_login(
            sign_in_form(request), self._cookies.browser(request), address, self._clock.seconds()
        )
        if isinstance(outcome, Redirect):
            return self._answer(request, outcome)
        return self._login_page(request, outcome)

    @app.route(ISSUER_PATH + "/login/passkey", methods=["POST"])
    async def login_passkey(self, request):
        """A passkey instead of the password, posted by the login page's passkey form."""
        address = client_address_of(request, self._trusted_proxies)
        outcome = await self._flows.interaction.submit_passkey(
            passkey_answer_form(request), self._cookies.browser(request), address, self._clock.seconds()
        )
        if isinstance(outcome, Redirect):
            return self._answer(request, outcome)
        return self._login_page(request, outcome)

    @app.route(ISSUER_PATH + "/mfa/passkey", methods=["POST"])
    async def second_factor_passkey(self, request):
        """A passkey as the second factor, posted by the second-factor page's passkey form."""
        address = client_address_of(request, self._trusted_proxies)
        outcome = await self._flows.interaction.submit_second_passkey(
            passkey_answer_form(request), self._cookies.browser(request), address, self._clock.seconds()
        )
        if isinstance(outcome, Redirect):
            return self._answer(request, outcome)
        return second_factor_page(request, f"{self._issuer}/mfa", outcome)

    @app.route(ISSUER_PATH + "/mfa", methods=["GET"])
    async def second_factor(self, request):
        form = await self._flows.interaction.second_factor_form(
            page_form(request), self._cookies.browser(request), self._now()
        )
        return second_factor_page(request, f"{self._issuer}/mfa", form)

    @app.route(ISSUER_PATH + "/mfa", methods=["POST"])
    async def second_factor_submitted(self, request):
        address = client_address_of(request, self._trusted_proxies)
        outcome = await self._flows.interaction.submit_second_factor(
            code_form(request), self._cookies.browser(request), address, self._clock.seconds()
        )
        if isinstance(outcome, Redirect):
            return self._answer(request, outcome)
        return second_factor_page(request, f"{self._issuer}/mfa", outcome)

    def _enrolment_page(self, request, path: str, form: EnrolmentForm) -> bytes:
        """The enrolment page; the browser keeps what it shows (L{ENROLMENT_COOKIE}) for a reload to show again."""
        self._cookies.set(request, ENROLMENT_COOKIE, form.sealed, ENROLMENT_TTL)
        return enrolment_page(request, f"{self._issuer}{path}", form)

    @app.route(ISSUER_PATH + "/mfa/enrol", methods=["GET"])
    async def enrolment(self, request):
        form = await self._flows.interaction.enrolment_form(
            page_form(request), self._cookies.browser(request), self._now(),
            self._cookies.get(request, ENROLMENT_COOKIE),
        )
        return self._enrolment_page(request, "/mfa/enrol", form)

    @app.route(ISSUER_PATH + "/mfa/enrol", methods=["POST"])
    async def enrolment_submitted(self, request):
        address = client_address_of(request, self._trusted_proxies)
        outcome = await self._flows.interaction.submit_enrolment(
            code_form(request), self._cookies.browser(request), address, self._clock.seconds()
        )
        if isinstance(outcome, Redirect):
            return self._answer(request, outcome)
        return self._enrolment_page(request, "/mfa/enrol", outcome)

    @app.route(ISSUER_PATH + "/consent", methods=["GET"])
    async def consent(self, request):
        form = await self._flows.interaction.consent_form(
            page_form(request), self._cookies.browser(request), self._now()
        )
        return consent_page(request, f"{self._issuer}/consent", form)

    @app.route(ISSUER_PATH + "/consent", methods=["POST"])
    async def consent_submitted(self, request):
        address = client_address_of(request, self._trusted_proxies)
        outcome = await self._flows.interaction.submit_consent(
            page_form(request), self._cookies.browser(request), address, self._now()
        )
        return self._answer(request, outcome)

    @app.route(ISSUER_PATH + "/oauth2/end-session", methods=["GET", "POST"])
    async def end_session(self, request):
        """
        End the browser's session and send the browser back to the client or
        show that the user is signed out; back-channel notices go out
        without the user waiting.
        """
        outcome = await self._flows.end_session.end(
            request.args, self._cookies.browser(request), self._now(), posted=request.method == b"POST",
            address=client_address_of(request, self._trusted_proxies),
        )
        if isinstance(outcome, LogoutConfirmation):
            return logout_confirmation_page(request, f"{self._issuer}/oauth2/end-session", outcome)
        return self._answer(request, outcome)

    # --- the signed-in user's account page ---------------------------------------

    def _account_page(self, request, view: AccountView, status: int = 200) -> bytes:
        return account_page(request, f"{self._issuer}/account", view, link_path=f"{self._issuer}/link/chat",
                            status=status)

    async def _account_done(self, request, outcome: str | PasswordRefused | Redirect) -> bytes:
        """
        A posted form's answer: Post/Redirect/Get, 303 to the account page
        naming what the form did (a key of L{NOTICES}), so a reload opens
        the page again and sends nothing; or the sign-in the form needs
        first; or the page with a refusal that counted nothing (400).
        """
        if isinstance(outcome, Redirect):
            return self._answer(request, outcome)
        if isinstance(outcome, PasswordRefused):
            return await self._account_refused(request, outcome)
        return self._answer(request, Redirect(f"{self._issuer}/account?done={outcome}", 303))

    async def _account_refused(self, request, refused: PasswordRefused) -> bytes:
        view = await self._flows.account_page.view(self._cookies.browser(request).session, self._now(), refused)
        return self._account_page(request, view, 400)

    @app.route(ACCOUNT_PATH, methods=["GET"])
    async def account(self, request):
        """The account page, or the sign-in a browser without a session needs first."""
        done = request.args.get(b"done", [b""])[0].decode("ascii", "replace")
        outcome = await self._flows.account_page.page(
            self._cookies.browser(request), client_address_of(request, self._trusted_proxies), self._now(), done
        )
        if isinstance(outcome, Redirect):
            return self._answer(request, outcome)
        return self._account_page(request, outcome)

    @app.route(ACCOUNT_PATH + "/sessions/end", methods=["POST"])
    async def account_end_session(self, request):
        address = client_address_of(request, self._trusted_proxies)
        return await self._account_done(request, await self._flows.account_page.end_session(
            self._cookies.browser(request).session, page_form(request), address, self._now()
        ))

    @app.route(ACCOUNT_PATH + "/apps/revoke", methods=["POST"])
    async def account_revoke_app(self, request):
        address = client_address_of(request, self._trusted_proxies)
        return await self._account_done(request, await self._flows.account_page.revoke_app(
            self._cookies.browser(request).session, page_form(request), address, self._now()
        ))

    @app.route(ACCOUNT_PATH + "/password", methods=["POST"])
    async def account_password(self, request):
        browser = self._cookies.browser(request)
        return await self._account_done(request, await self._flows.account_page.change_password(
            browser.session, password_change_form(request), client_address_of(request, self._trusted_proxies),
            browser.device, self._now(),
        ))

    @app.route(ACCOUNT_PATH + "/sign-in", methods=["GET"])
    async def account_sign_in(self, request):
        """Sign in (again, as changing factors needs a recent sign-in), and come back to the account page."""
        outcome = await self._flows.account_page.sign_in_again(
            self._cookies.browser(request), client_address_of(request, self._trusted_proxies), self._now()
        )
        return self._answer(request, outcome)

    @app.route(ACCOUNT_PATH + "/passkeys", methods=["POST"])
    async def account_add_passkey(self, request):
        return await self._account_done(request, await self._flows.account_page.register_passkey(
            self._cookies.browser(request), passkey_answer_form(request),
            client_address_of(request, self._trusted_proxies), self._now(),
        ))

    @app.route(ACCOUNT_PATH + "/passkeys/remove", methods=["POST"])
    async def account_remove_passkey(self, request):
        return await self._account_done(request, await self._flows.account_page.remove_passkey(
            self._cookies.browser(request), page_form(request), client_address_of(request, self._trusted_proxies),
            self._now(),
        ))

    # --- the signed-in user's own second factors --------------------------------

    @app.route(ACCOUNT_TOTP_PATH, methods=["GET"])
    async def account_totp(self, request):
        form = await self._flows.account.totp_form(
            self._cookies.browser(request), client_address_of(request, self._trusted_proxies), self._now(),
            self._cookies.get(request, ENROLMENT_COOKIE),
        )
        if isinstance(form, Redirect):
            return self._answer(request, form)
        return self._enrolment_page(request, "/account/mfa/totp", form)

    @app.route(ACCOUNT_TOTP_PATH, methods=["POST"])
    async def account_totp_submitted(self, request):
        outcome = await self._flows.account.submit_totp(
            self._cookies.browser(request), code_form(request), client_address_of(request, self._trusted_proxies),
            self._now(),
        )
        if isinstance(outcome, EnrolmentForm):
            return self._enrolment_page(request, "/account/mfa/totp", outcome)
        if outcome == TOTP_SET_UP:
            self._cookies.clear(request, ENROLMENT_COOKIE)
        return await self._account_done(request, outcome)

    @app.route(ACCOUNT_RECOVERY_PATH, methods=["POST"])
    async def account_recovery_codes(self, request):
        """
        A new set of recovery codes, shown by the page this answer leads to
        (Post/Redirect/Get), which the browser keeps them for: a reload of
        that page makes no other set.
        """
        outcome = await self._flows.account.replace_recovery_codes(
            self._cookies.browser(request), page_form(request), client_address_of(request, self._trusted_proxies),
            self._now(),
        )
        if isinstance(outcome, NewRecoveryCodes):
            self._cookies.set(request, RECOVERY_COOKIE, outcome.sealed, SHOWN_TTL)
            outcome = Redirect(f"{self._issuer}/account/mfa/recovery", 303)
        return self._answer(request, outcome)

    @app.route(ACCOUNT_RECOVERY_PATH, methods=["GET"])
    async def account_new_recovery_codes(self, request):
        """The codes the form above made, shown once: the browser's copy goes with this answer."""
        sealed = self._cookies.get(request, RECOVERY_COOKIE)
        if sealed is not None:
            self._cookies.clear(request, RECOVERY_COOKIE)
        codes = await self._flows.account.new_recovery_codes(self._cookies.browser(request), sealed, self._now())
        return recovery_codes_page(request, f"{self._issuer}/account/mfa/recovery", codes)

    # --- linking a chat account ------------------------------------------------

    def _linking(self):
        """The link flow, or the 404 page of a service without one."""
        linking = self._flows.linking
        if linking is None:
            raise PageError(404, "Chat linking unavailable", "This service does not link chat accounts.")
        return linking

    async def _linking_session(self, request):
        """The link flow and this browser's live session, or L{PageError}."""
        linking = self._linking()
        cookie = self._cookies.browser(request).session
        try:
            return linking, cookie, await linking.session(cookie, self._now())
        except BackendUnavailable:
            raise _cannot_check() from None

    @app.route(LINK_PATH, methods=["GET"])
    async def link_chat(self, request):
        """
        The page whose button starts a link (a POST, so that another site
        cannot start one); a browser without a session signs in first and
        comes back to this page's own fixed URL, never one the request names.
        """
        linking = self._linking()
        browser = self._cookies.browser(request)
        try:
            session = await linking.signed_in(browser.session, self._now())
        except BackendUnavailable:
            raise _cannot_check() from None
        if session is None:
            return self._answer(request, await self._flows.interaction.sign_in_again(
                linking.start_url, None, browser, client_address_of(request, self._trusted_proxies), self._now()
            ))
        return render_page(
            request, 200, f"Link your {linking.provider_name} account",
            tags.p("You will be sent to ", linking.provider_name, " to approve the link, then back here."),
            tags.form(method="post", action=linking.start_url)(
                tags.input(type="hidden", name="csrf", value=link_token(browser.session)),
                tags.button(type="submit")(f"Link your {linking.provider_name} account"),
            ),
            form_origin=linking.provider_origin,
        )

    @app.route(LINK_PATH, methods=["POST"])
    async def start_chat_link(self, request):
        """The start page's button: off to the provider."""
        linking, cookie, session = await self._linking_session(request)
        if not link_token_valid(cookie, (page_form(request) or {}).get("csrf")):
            raise PageError(403, "Not linked", "This form has expired. Reload the page and try again.")
        location = await linking.start(session, self._now())
        request.setHeader(b"referrer-policy", b"no-referrer")
        return self._answer(request, Redirect(location, 303))

    @app.route(LINK_PATH + "/callback", methods=["GET"])
    async def link_chat_callback(self, request):
        linking, cookie, session = await self._linking_session(request)
        try:
            params = page_params(request.args)
        except InvalidRequest as e:
            raise PageError(400, "Link not completed", e.description) from None
        account = await linking.finish(session, params, self._now(), client_address_of(request, self._trusted_proxies))
        return render_page(
            request, 200, "Chat account linked",
            tags.p("Your ", linking.provider_name, " account ", tags.strong(account.provider_user_id),
                   " is now linked."),
            tags.form(method="post", action=linking.unlink_url)(
                tags.input(type="hidden", name="csrf", value=unlink_token(cookie)),
                tags.button(type="submit")("Unlink"),
            ),
        )

    @app.route(LINK_PATH + "/unlink", methods=["POST"])
    async def unlink_chat(self, request):
        linking, cookie, session = await self._linking_session(request)
        if not unlink_token_valid(cookie, (page_form(request) or {}).get("csrf")):
            raise PageError(403, "Not unlinked", "This form has expired. Reload the page and try again.")
        unlinked = await linking.unlink(session, client_address_of(request, self._trusted_proxies))
        return await self._account_done(request, "chat-unlinked" if unlinked else "chat-gone")

    # --- failures ----------------------------------------------------------------

    @app.handle_errors(RateLimited, OAuthError, PageError, StoreUnavailable, BackendUnavailable)
    def refused(self, request, failure):
        return self._refusal(request, failure.value)

    def _refusal(self, request, error: Exception) -> bytes | None:
        """
        What any route answers to what it raised, under Klein or not: a rate
        limit as 429 with Retry-After, any OAuth error per RFC 6749 section
        5.2, a browser flow's refusal as a page, and an unreachable store or
        identity backend as 503 with a retry hint, never a 500 or a hang, and
        never a refusal that would end a user's grant. None for anything else.
        """
        if isinstance(error, RateLimited):
            request.setHeader(b"retry-after", str(error.retry_after).encode())
            return oauth_error(request, error)
        if isinstance(error, OAuthError):
            return oauth_error(request, error)
        if isinstance(error, PageError):
            if error.retry_after is not None:
                request.setHeader(b"retry-after", str(error.retry_after).encode())
            return error_page(request, error.status, error.title, error.message)
        if isinstance(error, StoreUnavailable):
            self._quiet.warn("store unavailable", error)
            return self._try_later(request, "the service cannot reach its database; try again")
        if isinstance(error, BackendUnavailable):
            self._quiet.warn("identity backend unavailable", error)
            return self._try_later(request, "the service cannot reach its user directory; try again")
        return None

    def _try_later(self, request, description: str) -> bytes:
        request.setHeader(b"retry-after", RETRY_AFTER)
        if _reads_json(request):
            return oauth_error(request, TemporarilyUnavailable(description))
        return error_page(
            request, 503, "Try again later", "The service is temporarily unavailable; please try again in a moment."
        )

    def _server_error(self, request) -> bytes:
        """The answer to a failure nothing foresaw (L{authsrv.web.failures})."""
        if _reads_json(request):
            return oauth_server_error(request)
        return error_page(request, 500, "Something went wrong",
                          "The service could not finish this request. Please try again in a moment.")

    @app.handle_errors(NotFound)
    def not_found(self, request, failure):
        """No such address: a page under a page's prefix (a person reads it, L{PAGE_PREFIXES}), else JSON."""
        if request.path.startswith(PAGE_PREFIXES):
            return error_page(request, 404, "Page not found",
                              "There is no page at this address. Go back to the application and start again.")
        return json_body(request, 404, {"error": "not_found", "error_description": "no such endpoint"})

    @app.handle_errors(MethodNotAllowed)
    def wrong_method(self, request, failure):
        """405 naming the methods, unless the endpoint is an optional one that is off: 404, whatever the method."""
        return self._switched_off(request) or _wrong_method(
            request, ", ".join(failure.value.valid_methods or ()).encode())

    def _switched_off(self, request) -> bytes | None:
        """The 404 its other methods answer, when C{request}'s path is an optional endpoint that is off."""
        path = request.path.decode("latin-1")
        flows = self._flows
        registering = path == REGISTER_PATH or path.startswith(REGISTER_PATH + "/")
        if (path == ISSUER_PATH + "/oauth2/par" and flows.pushed is None
                or path == ISSUER_PATH + "/oauth2/device-authorization" and flows.device is None
                or registering and flows.registration is None):
            return self.not_found(request, None)
        if path == ISSUER_PATH + "/device" and flows.device_verification is None:
            return error_page(request, 404, "Not available", "This service does not connect devices.")
        return None

    @app.handle_errors(Exception)
    def failed(self, request, failure):
        return unforeseen_in_klein(request, failure, self._server_error)
