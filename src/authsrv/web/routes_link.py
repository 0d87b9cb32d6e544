"""
The chat-account link pages under the issuer: C{GET /link/chat} starts
linking, C{GET /link/chat/callback} is where the provider sends the browser
back, C{POST /link/chat/unlink} removes the link. The flow is
L{authsrv.flows.link}; these routes only read the request and render pages.

They reach the flow through C{server.chat_link} (a
L{authsrv.flows.link.ChatLinking}), which is None, or not set, when no chat
provider client is configured: the pages then say linking is unavailable.
"""

from __future__ import annotations

from twisted.web.template import tags

from authsrv.config import ISSUER_PATH
from authsrv.flows.link import LinkProblem, unlink_token, unlink_token_valid
from authsrv.identity.errors import BackendUnavailable
from authsrv.protocol.errors import InvalidRequest
from authsrv.protocol.params import single_params
from authsrv.web.cookies import SESSION_COOKIE
from authsrv.web.pages import error_page, render_page
from authsrv.web.routing import app

LINK_PATH = ISSUER_PATH + "/link/chat"


def _problem_page(request, problem: LinkProblem) -> bytes:
    return error_page(request, problem.status, problem.title, problem.message)


async def _linking_session(server, request):
    """The flow and the live session of this browser, or L{LinkProblem}."""
    linking = server.chat_link
    if linking is None:
        raise LinkProblem(404, "Chat linking unavailable", "This service does not link chat accounts.")
    cookie = server.cookies.get(request, SESSION_COOKIE)
    return linking, cookie, await linking.session(cookie, server.now())


async def _page(request, step):
    """Run one step of the flow, turning what the user must be told into a page, never a 500."""
    try:
        return await step()
    except LinkProblem as problem:
        return _problem_page(request, problem)
    except InvalidRequest as e:
        return error_page(request, 400, "Link not completed", e.description)
    except BackendUnavailable:
        return error_page(request, 503, "Try again later", "The service cannot check your account right now.")


@app.route(LINK_PATH, methods=["GET"], endpoint="link.start")
async def link_chat(self, request):
    async def step():
        linking, _, session = await _linking_session(self, request)
        location = await linking.start(session, self.now())
        request.setResponseCode(302)
        request.setHeader(b"location", location.encode())
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"referrer-policy", b"no-referrer")
        return b""

    return await _page(request, step)


@app.route(LINK_PATH + "/callback", methods=["GET"], endpoint="link.callback")
async def link_chat_callback(self, request):
    async def step():
        linking, cookie, session = await _linking_session(self, request)
        account = await linking.finish(session, single_params(request.args), self.now())
        return render_page(
            request, 200, "Chat account linked",
            tags.p("Your ", linking.provider_name, " account ", tags.strong(account.provider_user_id),
                   " is now linked."),
            _unlink_form(linking, cookie),
        )

    return await _page(request, step)


@app.route(LINK_PATH + "/unlink", methods=["POST"], endpoint="link.unlink")
async def unlink_chat(self, request):
    async def step():
        linking, cookie, session = await _linking_session(self, request)
        if not unlink_token_valid(cookie, single_params(request.args).get("csrf")):
            raise LinkProblem(403, "Not unlinked", "This form has expired. Reload the page and try again.")
        if await linking.unlink(session):
            return render_page(request, 200, "Chat account unlinked",
                               tags.p("Your ", linking.provider_name, " account is no longer linked."))
        return render_page(request, 200, "Nothing to unlink", tags.p("No chat account was linked."))

    return await _page(request, step)


def _unlink_form(linking, cookie: str):
    return tags.form(method="post", action=linking.unlink_url)(
        tags.input(type="hidden", name="csrf", value=unlink_token(cookie)),
        tags.button(type="submit")("Unlink"),
    )
