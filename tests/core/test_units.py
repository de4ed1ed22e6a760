"""Byte sizes: what ``--memory`` and ``autobatch.toml`` accept, and how sizes are shown to people."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autobatch.core.units import format_bytes, parse_size

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * GiB),
        ("1.5G", GiB + GiB // 2),  # a letter alone is binary
        ("500MB", 500 * 1000**2),  # "B" after the letter is decimal
        ("512MiB", 512 * MiB),
        ("1k", KiB),
        ("1kb", 1000),
        ("1KiB", KiB),
        ("3T", 3 * TiB),
        ("2TB", 2 * 1000**4),
        ("4096", 4096),  # a bare number is bytes
        ("100b", 100),
        (" 16 gib ", 16 * GiB),  # case and spaces do not matter
        (".5GiB", GiB // 2),
        ("1.999B", 1),  # fractions of a byte are cut off
        (7, 7),  # ints are bytes already
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["", "GiB", "abc", "2 GiBs", "2XiB", "-1GiB", "1e9", "1,5G", "1.5.2G", "2 G iB", "0x10"]
)
def test_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match="not a size") as info:
        parse_size(text)
    assert "2GiB" in str(info.value)  # the message shows what a size looks like


@pytest.mark.parametrize("value", ["0", "0GiB", "0.0001B", 0, -5])
def test_sizes_must_be_positive(value: str | int) -> None:
    with pytest.raises(ValueError, match="must be more than 0 bytes"):
        parse_size(value)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536 * MiB, "1.50 GiB"),
        (80 * GiB, "80.00 GiB"),
        (-MiB, "-1.00 MiB"),  # differences can be negative
        (2048 * TiB, "2048.00 TiB"),  # TiB is the largest unit
        (12.7, "13 B"),
    ],
)
def test_format_bytes(n: float | None, text: str) -> None:
    assert format_bytes(n) == text


@pytest.mark.parametrize("text", ["2GiB", "512MiB", "3TiB", "1KiB", "100B"])
def test_whole_binary_sizes_round_trip_exactly(text: str) -> None:
    n = parse_size(text)
    assert parse_size(format_bytes(n)) == n
    assert format_bytes(n).replace(".00", "").replace(" ", "") == text


@given(st.integers(min_value=1, max_value=1 << 50))
def test_formatted_sizes_parse_back_within_the_shown_precision(n: int) -> None:
    shown = format_bytes(n)
    back = parse_size(shown)
    if n < KiB:
        assert back == n
    else:
        unit = {"KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}[shown.split()[1]]
        assert abs(back - n) <= unit * 0.005 + 1  # two decimals of the unit, then whole bytes


def test_petabytes_parse_and_zero_is_named() -> None:
    assert parse_size("1PiB") == 1024**5
    with pytest.raises(ValueError, match="more than 0 bytes"):
        parse_size("0")
