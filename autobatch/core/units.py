"""Byte sizes: parse ``2GiB``/``512MB``/``1.5G`` and format them for people."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
    "p": 1024**5,
    "pb": 1000**5,
    "pib": 1024**5,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse a byte size. Bare numbers are bytes; ``K``/``M``/``G``/``T`` alone are binary (GiB).

    >>> parse_size("2GiB"), parse_size("1.5G"), parse_size("500MB")
    (2147483648, 1610612736, 500000000)
    """
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"a size must be more than 0 bytes, found {text} (such as 2GiB)")
        return text
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(
            f"not a size: {text!r} (expected a number with a unit such as 2GiB, 512MiB or 500MB)"
        )
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"a size must be more than 0 bytes, found {text!r} (such as 2GiB)")
    return value


def format_bytes(n: float | None) -> str:
    """Format bytes with a binary unit: ``1.50 GiB``; ``-`` for None."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
