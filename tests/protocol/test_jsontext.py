"""
JSON from outside: every value of Unicode text reads back as itself, and
what is not Unicode text (a lone surrogate escaped or encoded, bytes that
are not UTF-8) is refused with a reason, as is what is not JSON.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from authsrv.protocol.jsontext import NotJSONText, loads

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(VALUES, st.booleans())
def test_unicode_text_reads_back_as_itself(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert loads(text) == value
    assert loads(text.encode("utf-8")) == value


@pytest.mark.parametrize("data", [
    rb'"\ud800"',
    rb'{"reason": "left \udfff"}',
    rb'{"\udbff": 1}',
    rb'[1, [2, {"a": ["\udc00"]}]]',
    rb'"\ude00\ud83d"',
    b'{"reason": "\xed\xa0\x80"}',
    '"\ud800"',
])
def test_a_lone_surrogate_is_refused(data):
    with pytest.raises(NotJSONText, match="surrogate|UTF-8"):
        loads(data)


def test_a_pair_and_an_escaped_backslash_are_text():
    assert loads(rb'"\ud83d\ude00"') == "\U0001f600"
    assert loads(rb'"\\ud800"') == "\\ud800"


@pytest.mark.parametrize("data, reason", [
    (b"\xff{}", "not UTF-8"),
    (b"{not json", "not valid JSON"),
    (b"", "not valid JSON"),
    (b"[" * 100_000, "nested too deeply"),
    (b'{"max_age": NaN}', "NaN is not a JSON number"),
    (b"[Infinity]", "Infinity is not a JSON number"),
    (b"-Infinity", "-Infinity is not a JSON number"),
    (b"1" * 5000, "not valid JSON"),
])
def test_what_is_not_json_text_says_why(data, reason):
    with pytest.raises(NotJSONText, match=reason):
        loads(data)
