"""The weights' keys (``pipeline.weight_keys``): their spelling is the stages' wire format,
every form reads back as what it was built from, and a report's weights parse into the
operators' band and crossing counts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpstream.statistics.weights import (
    DELETES,
    INSERTS,
    KEPT_UNITS,
    MEAN_SAMPLES,
    MEAN_UNITS,
    SCALAR_KEYS,
    STREAMS,
    BandKey,
    CrossingKey,
    DistinctKey,
    band_key,
    crossing_key,
    distinct_key,
    distinct_values,
    parse_key,
    parse_weights,
)

streams = st.sampled_from(STREAMS)
indices = st.integers(0, 70)
# Distinct values as stage 1 sees them (floats) and as the key builder takes any value.
values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(10**20), 10**20),
    st.text(max_size=12),
)


def test_the_spelling_is_the_wire_format():
    # Reports, the export log and stage 1's changelog hold these exact strings.
    assert (KEPT_UNITS, MEAN_SAMPLES, MEAN_UNITS) == ("w", "c", "s")
    assert STREAMS == (INSERTS, DELETES) == ("+", "-")
    assert band_key(INSERTS, 3, 0) == "+b3/0"
    assert band_key(DELETES, 12, 7) == "-b12/7"
    assert crossing_key(INSERTS, 0) == "+x0"
    assert crossing_key(DELETES, 41) == "-x41"
    assert distinct_key(2, 3.0) == "b2/3.0"
    assert distinct_key(0, -0.0) == distinct_key(0, 0.0) == "b0/0.0"
    assert distinct_key(5, "a/b") == "b5/'a/b'"


@given(stream=streams, band=indices, column=indices)
def test_a_band_key_reads_back(stream, band, column):
    assert parse_key(band_key(stream, band, column)) == BandKey(stream, band, column)


@given(stream=streams, power=indices)
def test_a_crossing_key_reads_back(stream, power):
    assert parse_key(crossing_key(stream, power)) == CrossingKey(stream, power)


@given(band=indices, value=values)
def test_a_distinct_key_reads_back_as_the_values_repr(band, value):
    assert parse_key(distinct_key(band, value)) == DistinctKey(band, repr(_zero(value)))


@pytest.mark.parametrize("value", [2.5, -0.0, 0.0, 1e20, -7, "", "a/b/c", "it's", "+x1", "b2/0"])
def test_distinct_values_that_look_like_keys_or_hold_slashes_read_back(value):
    assert parse_key(distinct_key(4, value)) == DistinctKey(4, repr(_zero(value)))


def _zero(value: object) -> object:
    return 0.0 if value == 0 and type(value) is float else value


def test_the_keys_of_one_number_parse_to_none():
    assert SCALAR_KEYS == (KEPT_UNITS, MEAN_SAMPLES, MEAN_UNITS)
    assert [parse_key(key) for key in SCALAR_KEYS] == [None] * 3


@pytest.mark.parametrize("key", ["", "x", "+", "+y3", "+b3", "-x", "b", "b3", "+b1/2/3", "ww"])
def test_a_key_of_no_form_is_refused(key):
    with pytest.raises(ValueError, match="weight key must be one of the forms") as refused:
        parse_key(key)
    assert str(refused.value).endswith(f"got {key[:2]!r}...")


def test_a_refused_key_leaves_the_value_out_of_the_message():
    with pytest.raises(ValueError) as refused:
        parse_key("bx/secret")
    assert "secret" not in str(refused.value)


# One unit count per key: (stream, band, column, units) and (stream, power, users).
band_entries = st.lists(st.tuples(streams, indices, indices, st.integers(1, 9)), max_size=20)
crossing_entries = st.lists(st.tuples(streams, indices, st.integers(1, 9)), max_size=20)


@given(bands=band_entries, crossings=crossing_entries, mean=st.booleans())
def test_parse_weights_sums_each_streams_bands_and_crossings(bands, crossings, mean):
    weights: dict[str, int] = {MEAN_SAMPLES: 1, MEAN_UNITS: 4} if mean else {}
    for stream, band, column, units in bands:
        key = band_key(stream, band, column)
        weights[key] = weights.get(key, 0) + units
    for stream, power, users in crossings:
        key = crossing_key(stream, power)
        weights[key] = weights.get(key, 0) + users
    weights[distinct_key(3, 1.0)] = 1  # another statistic's form: skipped
    for stream in STREAMS:
        got_bands, got_crossings = parse_weights(weights, stream)
        mine = [(b, c, n) for s, b, c, n in bands if s == stream]
        assert len(got_bands) == max((b + 1 for b, _, _ in mine), default=0)
        for band, row in enumerate(got_bands):
            columns = [(c, n) for b, c, n in mine if b == band]
            assert len(row) == max((c + 1 for c, _ in columns), default=0)
            assert row == [sum(n for c, n in columns if c == i) for i in range(len(row))]
        powers = [(p, n) for s, p, n in crossings if s == stream]
        assert len(got_crossings) == max((p + 1 for p, _ in powers), default=0)
        assert got_crossings == [
            sum(n for p, n in powers if p == j) for j in range(len(got_crossings))
        ]


def test_parse_weights_of_a_report():
    weights = {"+x0": 2, "+x1": 1, "+b0/0": 2, "+b2/1": 3, "-x0": 1, "-b1/0": 1}
    assert parse_weights(weights, INSERTS) == ([[2], [], [0, 3]], [2, 1])
    assert parse_weights(weights, DELETES) == ([[], [1]], [1])
    assert parse_weights({KEPT_UNITS: 5}, INSERTS) == ([], [])


def test_distinct_values_are_the_reprs_by_band_sorted():
    weights = {
        crossing_key(INSERTS, 0): 2,
        distinct_key(2, 9.5): 1,
        distinct_key(0, 3.0): 1,
        distinct_key(2, "x/y"): 1,
        distinct_key(2, -1.0): 1,
    }
    assert distinct_values(weights) == [["3.0"], [], ["'x/y'", "-1.0", "9.5"]]
    assert distinct_values({crossing_key(INSERTS, 0): 1, KEPT_UNITS: 1}) == []
