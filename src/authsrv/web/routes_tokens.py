"""
The relying-party-facing endpoints: token, UserInfo, introspection and
revocation. Each reads the request, hands values to a flow and renders its
answer; an L{authsrv.protocol.errors.OAuthError} a flow raises is rendered by
L{authsrv.web.app.AuthServer.oauth_failure}.

Token, revocation and UserInfo allow any origin: single-page apps call them
from the browser, and none of them relies on a cookie, so CORS grants a page
nothing its client credentials or bearer token would not. Introspection is
for servers only.
"""

from __future__ import annotations

from twisted.web.http import parse_qs

from authsrv.config import ISSUER_PATH
from authsrv.flows.introspect import introspect
from authsrv.flows.revoke import revoke
from authsrv.flows.token import authenticate_client, token_response
from authsrv.flows.userinfo import bearer_token, userinfo
from authsrv.protocol.errors import InvalidRequest
from authsrv.protocol.params import single_params
from authsrv.web.headers import allow_any_origin, json_body
from authsrv.web.routing import app

FORM = b"application/x-www-form-urlencoded"


def _is_form(request) -> bool:
    content_type = request.getHeader(b"content-type") or b""
    return content_type.split(b";", 1)[0].strip().lower() == FORM


def form_params(request) -> dict[str, str]:
    """
    The parameters of a back-channel POST, from a form body only: a query
    string would leave credentials and tokens in logs (OAuth 2.1 section 3.2).
    """
    if not _is_form(request):
        raise InvalidRequest("send the parameters as an application/x-www-form-urlencoded body")
    if b"?" in request.uri:
        raise InvalidRequest("send the parameters in the request body, not in the query string")
    return single_params(request.args)


def _cors(request) -> None:
    allow_any_origin(request)
    request.setHeader(b"access-control-expose-headers", b"WWW-Authenticate")


def _preflight(request, methods: bytes) -> bytes:
    _cors(request)
    request.setHeader(b"access-control-allow-methods", methods)
    request.setHeader(b"access-control-allow-headers", b"Authorization, Content-Type")
    request.setHeader(b"access-control-max-age", b"86400")
    request.setResponseCode(204)
    return b""


@app.route(ISSUER_PATH + "/oauth2/token", methods=["POST"], endpoint="tokens.token")
async def token(server, request):
    _cors(request)
    params = form_params(request)
    response = await token_response(server, request.getHeader(b"authorization"), params, server.now())
    return json_body(request, 200, response, no_store=True)


@app.route(ISSUER_PATH + "/oauth2/token", methods=["OPTIONS"], endpoint="tokens.token_preflight")
def token_preflight(server, request):
    return _preflight(request, b"POST, OPTIONS")


@app.route(ISSUER_PATH + "/oauth2/userinfo", methods=["GET", "POST"], endpoint="tokens.userinfo")
async def userinfo_endpoint(server, request):
    _cors(request)
    query = request.uri.partition(b"?")[2]
    if query and b"access_token" in parse_qs(query):
        raise InvalidRequest("send the access token in the Authorization header, not in the URL")
    form_token = None
    if request.method == b"POST" and _is_form(request):
        form_token = single_params(request.args).get("access_token")
    access_token = bearer_token(request.getHeader(b"authorization"), form_token)
    claims = await userinfo(server, access_token, server.now())
    return json_body(request, 200, claims, no_store=True)


@app.route(ISSUER_PATH + "/oauth2/userinfo", methods=["OPTIONS"], endpoint="tokens.userinfo_preflight")
def userinfo_preflight(server, request):
    return _preflight(request, b"GET, POST, OPTIONS")


@app.route(ISSUER_PATH + "/oauth2/introspect", methods=["POST"], endpoint="tokens.introspect")
async def introspection(server, request):
    params = form_params(request)
    client = await authenticate_client(server.clients, request.getHeader(b"authorization"), params)
    answer = await introspect(server, client, params, server.now())
    return json_body(request, 200, answer, no_store=True)


@app.route(ISSUER_PATH + "/oauth2/revoke", methods=["POST"], endpoint="tokens.revoke")
async def revocation(server, request):
    _cors(request)
    params = form_params(request)
    client = await authenticate_client(server.clients, request.getHeader(b"authorization"), params)
    await revoke(server, client, params, server.now())
    request.setHeader(b"cache-control", b"no-store")
    return b""


@app.route(ISSUER_PATH + "/oauth2/revoke", methods=["OPTIONS"], endpoint="tokens.revoke_preflight")
def revocation_preflight(server, request):
    return _preflight(request, b"POST, OPTIONS")
