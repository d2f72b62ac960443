from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twin.errors import UnitError
from twin.units import format_bytes, parse_bandwidth, parse_bytes, parse_duration, parse_flops


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2", 2.0),
        (2, 2.0),
        ("50ms", 0.05),
        ("50 ms", 0.05),
        ("10 us", 1e-5),
        ("1 min", 60.0),
        ("1h", 3600.0),
        ("1.5e-3 s", 1.5e-3),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-15)


def test_bits_and_bytes_and_binary_prefixes_are_exact():
    assert parse_bandwidth("400 Gbps") == 50e9
    assert parse_bandwidth("400 Gb/s") == 50e9
    assert parse_bandwidth("25 GB/s") == 25e9
    assert parse_bandwidth("1 GiB/s") == 2**30
    assert parse_bytes("80 GiB") == 80 * 2**30
    assert parse_bytes("80 GB") == 80e9
    assert parse_bytes("8 Gib") == 2**30
    assert parse_flops("989 TFLOPS") == pytest.approx(989e12)


@pytest.mark.parametrize("bad", ["1 parsec", "fast", "", True, None, [1], "1e999 s"])
def test_bad_durations_name_the_value_and_the_units(bad):
    with pytest.raises(UnitError, match="expected|finite"):
        parse_duration(bad)


def test_unknown_size_unit():
    with pytest.raises(UnitError, match=r"'3 quarts' is not a size; expected .*GiB"):
        parse_bytes("3 quarts")


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_milliseconds_round_trip(x):
    assert parse_duration(f"{x!r} ms") == pytest.approx(x / 1e3, rel=1e-12, abs=1e-300)


def test_format_bytes():
    assert format_bytes(1536) == "1.500 KiB"
    assert format_bytes(80 * 2**30) == "80.000 GiB"
    assert format_bytes(10) == "10 B"
