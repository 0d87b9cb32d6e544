"""
The login page is prepared once per shape (L{authsrv.web.pages.PreparedPage}):
for any texts, with every character the escaping must change, it is the
page twisted.web.template makes from the same tags on every request.
"""

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.web.test.requesthelper import DummyRequest

from authsrv.flows.outcomes import LoginForm
from authsrv.web.interaction_pages import _login_content, another_account, login_page
from authsrv.web.pages import PreparedPage, render_page

texts = st.text(alphabet=st.sampled_from('a<>&"\' =/é\u2028;') | st.characters(blacklist_categories=("Cs",)), max_size=20)
"""Any text a form could hold: the web layer refuses what is not UTF-8, so no lone surrogates."""
marker_like = st.just("field-0123456789abcdef")


def rendered(make):
    request = DummyRequest([b"login"])
    body = make(request)
    return request.responseCode, dict(request.responseHeaders.getAllRawHeaders()), body


@settings(max_examples=300, deadline=None)
@given(
    client_name=texts | marker_like, username=texts, message=st.none() | texts, csrf=texts, interaction_id=texts,
    options=st.none() | texts, status=st.sampled_from([200, 429, 503]), retry_after=st.none() | st.integers(1, 99),
)
def test_prepared_login_page_is_the_flattened_one(client_name, username, message, csrf, interaction_id, options,
                                                   status, retry_after):
    form = LoginForm(status=status, client_name=client_name, interaction_id=interaction_id, csrf=csrf,
                     client_origin="https://app.example", username=username, message=message,
                     retry_after=retry_after, passkey_options=options)
    action = "https://id.example/login"
    values = {"client_name": client_name, "message": message, "action": action, "username": username,
              "interaction_id": interaction_id, "csrf": csrf, "passkey_action": action + "/passkey",
              "passkey_options": options,
              "another_account": another_account(action, interaction_id)}

    def flattened(request):
        if retry_after is not None:
            request.setHeader(b"retry-after", str(retry_after).encode())
        content = _login_content(bool(message), options is not None, bool(username), values.__getitem__)
        return render_page(request, status, "Sign in", *content, form_origin=form.client_origin)

    assert rendered(lambda request: login_page(request, action, form)) == rendered(flattened)


def test_a_field_in_an_attribute_escapes_quotes_and_one_in_text_does_not():
    from twisted.web.template import tags

    page = PreparedPage("T", lambda field: (tags.p(title=field("a"))(field("b")),))
    body = page.render(DummyRequest([b""]), 200, a='"<&>', b='"<&>')
    assert b'<p title="&quot;&lt;&amp;&gt;">"&lt;&amp;&gt;</p>' in body
