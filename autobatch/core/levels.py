"""Recomputation as a level between off and full: names, the order of their work, and the partial level a plan
needs.

Pure: :func:`parse_level` reads the ``recompute`` setting's items (``off``, ``K/N``, ``selective``, ``full``,
``partial`` and the booleans of old), :func:`partial_line` predicts a ``K/N`` line from the lines of ``off``
and ``full``, :func:`partial_for` picks the K a plan needs, and :func:`less_work` orders levels by what they
recompute. What each level checkpoints: docs/levers.md.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "FULL",
    "OFF",
    "PARTIAL",
    "SELECTIVE",
    "fraction",
    "key_word",
    "less_work",
    "parse_level",
    "partial_for",
    "partial_line",
    "work_rank",
]

OFF, FULL, SELECTIVE, PARTIAL = "off", "full", "selective", "partial"
#: What the setting accepts for each level (besides ``K/N``); booleans are read as ``true``/``false``.
WORDS = {
    "off": OFF,
    "false": OFF,
    "no": OFF,
    "0": OFF,
    "full": FULL,
    "true": FULL,
    "on": FULL,
    "yes": FULL,
    "1": FULL,
    "selective": SELECTIVE,
    "partial": PARTIAL,
}
_FRACTION = re.compile(r"^(\d+)\s*/\s*(\d+)$")


def parse_level(value: object) -> str:
    """A level from a setting's item: a bool, a word of :data:`WORDS`, or ``K/N`` with 0 < K < N (``0/N`` is
    ``off``, ``N/N`` is ``full``); ValueError for anything else."""
    if isinstance(value, bool):
        return FULL if value else OFF
    text = str(value).strip().lower()
    if text in WORDS:
        return WORDS[text]
    match = _FRACTION.match(text)
    if match:
        k, n = int(match.group(1)), int(match.group(2))
        if 0 <= k <= n and n > 0:
            return OFF if k == 0 else FULL if k == n else f"{k}/{n}"
    raise ValueError(f"not a recomputation level: {value!r} (off, full, selective, partial, or K/N)")


def fraction(level: str) -> tuple[int, int] | None:
    """``(K, N)`` of a partial level, else None."""
    match = _FRACTION.match(level)
    return (int(match.group(1)), int(match.group(2))) if match else None


def recomputes(level: str) -> bool:
    """Whether a level recomputes anything."""
    return level != OFF


def key_word(level: str) -> str:
    """The level in a combination's key: ``no-recompute``, ``recompute`` (full), ``recompute-selective``,
    ``recompute-6of12``, ``recompute-partial`` (not chosen yet)."""
    if level == OFF:
        return "no-recompute"
    if level == FULL:
        return "recompute"
    return "recompute-" + level.replace("/", "of")


def share(level: str) -> float | None:
    """The share of the blocks a level checkpoints (None: ``selective``, ``partial``, whose work is not a share)."""
    if level == OFF:
        return 0.0
    if level == FULL:
        return 1.0
    found = fraction(level)
    return found[0] / found[1] if found else None


def work_rank(level: str) -> float:
    """An order of the levels by recomputation, for ties: ``off``, then ``K/N`` by its share, then
    ``selective`` (it touches every block), then ``full``."""
    if level == SELECTIVE:
        return 1.5
    found = share(level)
    return 2.0 if level == FULL else (found if found is not None else 3.0)


def less_work(cheaper: str, dearer: str) -> bool:
    """``cheaper`` recomputes strictly a part of what ``dearer`` recomputes, so at the same micro-batch and
    accumulation it is faster for certain."""
    if cheaper == dearer:
        return False
    if cheaper == OFF:
        return True
    if dearer == FULL:
        return cheaper == SELECTIVE or fraction(cheaper) is not None
    a, b = share(cheaper), share(dearer)
    return a is not None and b is not None and fraction(dearer) is not None and a < b


def partial_line(off: tuple[float, float], full: tuple[float, float], k: int, n: int) -> tuple[float, float]:
    """The line ``(intercept, slope)`` of ``K/N`` between the measured lines of ``off`` and ``full``."""
    t = k / n
    return off[0] + t * (full[0] - off[0]), off[1] + t * (full[1] - off[1])


def partial_for(
    off: tuple[float, float], full: tuple[float, float], n: int, target: int | None, line_bytes: float
) -> int | None:
    """The K a plan's micro-batch ``target`` needs: the fewest blocks whose predicted maximum reaches it (the
    middle K when no plan binds, ``target`` None). None when no K strictly between 0 and N reaches it (``full``
    alone does, or nothing does) or there are fewer than two blocks."""
    if n < 2:
        return None
    if target is None:
        return n // 2
    for k in range(1, n):
        intercept, slope = partial_line(off, full, k, n)
        if slope > 0 and math.floor((line_bytes - intercept) / slope) >= target:
            return k
    return None
