"""Reading the ISO-8601 times events carry: `epoch_of` and `seconds_between`, used by the controller, the
API and the client alike."""

from __future__ import annotations

from noetl_stream.protocol.wire import epoch_of, iso_at, seconds_between


def test_epoch_of_reads_what_the_runtime_writes_and_other_offsets() -> None:
    assert epoch_of(iso_at(1_800_000_000.25)) == 1_800_000_000.25
    assert epoch_of("2027-01-15T08:00:00+01:00") == epoch_of("2027-01-15T07:00:00Z")
    assert epoch_of("2027-01-15T07:00:00") == epoch_of("2027-01-15T07:00:00Z")  # no offset: UTC
    assert [epoch_of(v) for v in (None, "", "yesterday")] == [None, None, None]


def test_seconds_between_rounds_and_never_goes_back() -> None:
    assert seconds_between("2027-01-15T07:00:00.000Z", "2027-01-15T07:00:01.2345Z") == 1.234
    assert seconds_between("2027-01-15T07:00:02Z", "2027-01-15T07:00:01Z") == 0.0
    assert seconds_between(None, "2027-01-15T07:00:01Z") is None
    assert seconds_between("2027-01-15T07:00:00Z", "soon") is None
