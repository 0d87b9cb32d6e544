"""
compactjson writes what the standard encoder writes, as UTF-8 without
spaces: any JSON value reads back equal, and what orjson refuses falls back
to the standard encoder rather than failing a request.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from authsrv.compactjson import compact

TEXT = st.text(st.characters(blacklist_categories=("Cs",)))


def json_values(scalars):
    return st.recursive(scalars, lambda children: st.lists(children) | st.dictionaries(TEXT, children),
                        max_leaves=20)


WITHOUT_FLOATS = json_values(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | TEXT)


@given(WITHOUT_FLOATS)
def test_any_json_value_is_the_standard_encoders_bytes_in_utf_8(value):
    assert compact(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@given(json_values(st.floats(allow_nan=False, allow_infinity=False) | WITHOUT_FLOATS))
def test_any_json_value_reads_back_equal(value):
    """Floats too, though orjson writes some otherwise (0.00006103515625 for the standard 6.103515625e-05)."""
    assert json.loads(compact(value)) == value


@pytest.mark.parametrize("value", [
    {"big": 2**70, "é": 1},
    {"deep": json.loads("[" * 300 + "]" * 300)},
    {"lone": "\ud800"},
])
def test_what_orjson_refuses_is_written_as_the_standard_encoder_writes_it(value):
    assert compact(value) == json.dumps(value, separators=(",", ":")).encode()


def test_keys_that_are_not_strings_are_written_as_the_standard_encoder_writes_them():
    value = {1: "a", None: "b", True: "c", 2.5: "d"}
    assert compact(value) == json.dumps(value, separators=(",", ":")).encode()


def test_what_no_encoder_writes_is_a_type_error():
    with pytest.raises(TypeError):
        compact({"a": object()})
