"""authsrv.compactjson writes exactly what json.dumps with compact separators writes."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from authsrv.compactjson import compact

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(VALUES)
def test_compact_is_json_dumps_without_spaces(value):
    assert compact(value) == json.dumps(value, separators=(",", ":"))


def test_compact_escapes_as_ascii():
    assert compact({"name": "Zoë \u2028"}) == '{"name":"Zo\\u00eb \\u2028"}'
