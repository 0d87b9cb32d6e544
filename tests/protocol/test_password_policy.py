"""The password policy every place that sets a password uses (NIST SP 800-63B)."""

from __future__ import annotations

import pytest

from authsrv.protocol import password_policy
from authsrv.protocol.password_policy import MAX_LENGTH, common_passwords, password_problem


def test_a_long_uncommon_password_is_taken():
    assert password_problem("violet kettle harbour") is None


@pytest.mark.parametrize("password", ["", "a", "seven77"])
def test_too_short(password):
    assert password_problem(password) == (
        f"the password must be at least 8 characters long (it has {len(password)});"
        " a few unrelated words make a good one"
    )


def test_the_minimum_is_configurable():
    assert password_problem("quiet river", min_length=12).startswith("the password must be at least 12 characters")
    assert password_problem("quiet rivers", min_length=12) is None


def test_at_most_1024_characters():
    assert password_problem("x7" * 512) is None
    assert password_problem("x7" * 512 + "y") == "the password must be at most 1,024 characters long (it has 1,025)"
    assert len("x7" * 512) == MAX_LENGTH


@pytest.mark.parametrize("password", ["quiet river\x00", "quiet\nriver", "quiet\r\nriver", "quiet\triver",
                                      "quiet river\x7f", "quiet river\x85"])
def test_control_characters_are_refused(password):
    """A password set with one (through the admin API, say) could never be typed at sign-in."""
    assert password_problem(password) == (
        "the password must not hold control characters (such as NUL, a tab or a line break),"
        " which the sign-in form cannot send"
    )


def test_joiners_and_other_format_characters_are_text():
    assert password_problem("quiet river \U0001f469\u200d\U0001f4bb") is None


@pytest.mark.parametrize("password", ["password", "PASSWORD", "12345678", "iloveyou", "Trustno1", "qwertyuiop"])
def test_common_passwords_are_refused_in_any_case(password):
    assert password_problem(password) == (
        "the password is one of the most common passwords, which attackers try first; choose another"
    )


def test_the_shipped_list_holds_at_least_ten_thousand():
    assert len(common_passwords()) >= 10_000
    assert {"123456", "password", "dragon"} <= common_passwords()


def test_the_list_is_read_once():
    password_policy.common_passwords.cache_clear()
    for candidate in ("password1", "something else entirely", "letmein123"):
        password_problem(candidate)
    assert password_policy.common_passwords.cache_info().misses == 1
    assert common_passwords() is common_passwords()


SELF = "the password must not contain the user's login or email address; choose another"


@pytest.mark.parametrize("password, login, email", [
    ("Margaret", "margaret", None),
    ("margaret2024!", "Margaret", None),
    ("my name is MARGARET", "margaret", None),
    ("m.hill@example.org", None, "M.Hill@Example.org"),
    ("ahoy m.hill ahoy", None, "m.hill@example.org"),
    ("Bobby Tables 1", "bobby", None),
])
def test_the_users_own_login_or_email_is_refused(password, login, email):
    assert password_problem(password, login=login, email=email) == SELF


@pytest.mark.parametrize("password, login, email", [
    ("bob-bob-bob-bob", "bob", None),
    ("nothing alike here", "margaret", "m.hill@example.org"),
    ("abc fine password", None, "abc@example.org"),
])
def test_short_names_inside_and_unrelated_passwords_pass(password, login, email):
    assert password_problem(password, login=login, email=email) is None


def test_lengths_count_characters_not_bytes():
    assert password_problem("ünïcødé") is not None
    assert password_problem("ünïcødé!") is None
    assert password_problem("密码密码密码密码") is None


def test_passwords_are_normalised_to_nfkc_first():
    # Full-width letters and the "ﬁ" ligature are what NFKC folds into ASCII.
    assert password_problem("ｐａｓｓｗｏｒｄ") == password_problem("password")
    assert password_problem("ｍａｒｇａｒｅｔ!", login="margaret") == SELF
    # A decomposed "é" (e and a combining accent) is one character after normalising.
    assert password_problem("e\u0301" * 7).endswith("(it has 7); a few unrelated words make a good one")
    assert password_problem("e\u0301" * 8) is None
    assert password_problem("ﬁsh") is not None
