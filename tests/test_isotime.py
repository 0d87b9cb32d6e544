"""Times as the contract and the logs write them."""

from datetime import datetime, timezone

from hypothesis import given
from hypothesis import strategies as st

from authsrv.isotime import iso_utc, iso_utc_ms


def test_whole_seconds_end_in_z():
    assert iso_utc(1_900_000_000) == "2030-03-17T17:46:40Z"


def test_milliseconds_are_truncated_never_rounded_up():
    assert iso_utc_ms(1_900_000_000.2509) == "2030-03-17T17:46:40.250Z"
    assert iso_utc_ms(1_900_000_000.9999) == "2030-03-17T17:46:40.999Z"
    assert iso_utc_ms(1_900_000_000) == "2030-03-17T17:46:40.000Z"


@given(st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False))
def test_milliseconds_read_as_strftime_writes_them(seconds):
    moment = datetime.fromtimestamp(seconds, timezone.utc)
    assert iso_utc_ms(seconds) == moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
