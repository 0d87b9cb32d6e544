"""
The forms' fields as assistive technology and password managers meet them,
rendered in memory: a message shown again is read with the fields it is
about, and the cursor starts in the field the user still has to fill.
"""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from twisted.web.test.requesthelper import DummyRequest

from authsrv.flows.account import AccountView, PasswordRefused
from authsrv.flows.outcomes import DeviceCodeForm, EnrolmentForm, LoginForm, SecondFactorForm
from authsrv.web.account_pages import account_page
from authsrv.web.device_pages import device_code_page
from authsrv.web.interaction_pages import enrolment_page, login_page, second_factor_page

ACTION = "https://id.example/api/auth/login"


class _Elements(HTMLParser):
    def __init__(self):
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))


def elements(body: bytes, tag: str) -> list[dict[str, str | None]]:
    """The attributes of each C{tag} element of a page, in order."""
    parser = _Elements()
    parser.feed(body.decode())
    return [attrs for name, attrs in parser.elements if name == tag]


def focused(body: bytes) -> list[str]:
    return [attrs["id"] for attrs in elements(body, "input") if "autofocus" in attrs]


def login(username: str = "", message: str | None = None) -> bytes:
    form = LoginForm(status=200, client_name="Partner", interaction_id="req-1", csrf="c",
                     client_origin="https://app.example", username=username, message=message)
    return login_page(DummyRequest([b""]), ACTION, form)


def test_an_empty_login_form_starts_at_the_user_name_and_offers_no_other_account():
    body = login()
    assert focused(body) == ["username"]
    assert b"Use another account" not in body


@pytest.mark.parametrize("message", [None, "The username or password is incorrect."])
def test_a_filled_user_name_starts_at_the_password_and_offers_another_account(message):
    body = login("bob@example", message)
    assert focused(body) == ["password"]
    [link] = [a for a in elements(body, "a") if a["href"].startswith(ACTION + "?")]
    assert link["href"] == ACTION + "?request=req-1&account=other"


@pytest.mark.parametrize("page", [
    lambda message: login("bob", message),
    lambda message: second_factor_page(DummyRequest([b""]), ACTION, SecondFactorForm(
        status=200, client_name="Partner", interaction_id="req-1", csrf="c", client_origin="https://app.example",
        message=message)),
    lambda message: enrolment_page(DummyRequest([b""]), ACTION, EnrolmentForm(
        status=200, user_label="bob", secret="ABC", otpauth_uri="otpauth://totp/x?secret=ABC",
        recovery_codes=("aaaaa-bbbbb",), sealed="s", fields=(("csrf", "c"),), message=message)),
    lambda message: device_code_page(DummyRequest([b""]), ACTION, DeviceCodeForm(message=message)),
], ids=["login", "second factor", "enrolment", "device code"])
def test_a_message_is_announced_and_read_with_the_fields(page):
    body = page("Not right.")
    [shown] = [p for p in elements(body, "p") if p.get("id") == "message"]
    assert shown["role"] == "alert"
    typed = [attrs for attrs in elements(body, "input") if attrs["type"] in ("text", "password")]
    assert typed and all(attrs["aria-describedby"] == "message" for attrs in typed)
    assert focused(body), "the cursor starts in the field to fill again"
    assert all("aria-describedby" not in attrs for attrs in elements(page(None), "input"))


def account(message: str | None) -> bytes:
    view = AccountView(user_label="bob", sessions=(), apps=(), chat_provider=None, chat_account=None,
                       chat_unlink_csrf=None, factors_enabled=False, totp=False, recovery_left=None, passkeys=(),
                       can_change_password=True, csrf="c", message=message)
    return account_page(DummyRequest([b""]), "https://id.example/api/auth/account", view, link_path="/link")


def test_a_refused_password_change_is_said_by_the_password_form():
    """
    Not at the top of a long page, out of sight: above the form, read with
    its fields, the cursor in the first; the page's other news is no error.
    """
    body = account(PasswordRefused("Your current password is not right."))
    main = body.split(b"<main>")[1]
    assert main.index(b'id="message"') > main.index(b"<h2>Password</h2>")
    [shown] = [p for p in elements(body, "p") if p.get("id") == "message"]
    assert shown["role"] == "alert" and shown["class"] == "error"
    typed = [attrs for attrs in elements(body, "input") if attrs["type"] == "password"]
    assert len(typed) == 3 and all(attrs["aria-describedby"] == "message" for attrs in typed)
    assert focused(body) == ["current_password"]

    body = account("Your password is changed; your other sessions are signed out.")
    [shown] = [p for p in elements(body, "p") if p.get("role") == "status"]
    assert shown["class"] == "notice"
    assert not focused(body) and all("aria-describedby" not in attrs for attrs in elements(body, "input"))


def test_the_password_form_names_whose_password_changes():
    """A password manager saves the new password for the account's user name (a hidden field, as Chromium asks)."""
    [username] = [attrs for attrs in elements(account(None), "input") if attrs.get("autocomplete") == "username"]
    assert username["value"] == "bob" and "hidden" in username and username["type"] == "text"
