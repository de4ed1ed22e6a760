"""Sequence length as a dimension: peak memory over batch size and length, fitted from a few lengths.

A :class:`Surface` ``peak(B, L) = a + b·B·L + c·B·L²`` is fitted (:func:`fit`) to the lines the search
measured at each length; it gives the prior of a length not yet searched (:func:`prior_line`), the maximum
at a length not searched (:meth:`Surface.max_batch`, predicted, never measured), the longest length a batch
survives (:meth:`Surface.longest`) and the :func:`token_budget`. Pure: no torch. The model and its fit are
explained in docs/sequence-lengths.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Line:
    """One length's measured line: ``peak(B) = intercept + slope·B`` at ``seq_len`` tokens per sample."""

    seq_len: int
    intercept: float
    slope: float


@dataclass(frozen=True)
class Surface:
    """``peak(B, L) = intercept + per_token·B·L + per_token_squared·B·L²`` (bytes), fitted from ``lengths``."""

    intercept: float
    per_token: float
    per_token_squared: float
    lengths: tuple[int, ...]

    def slope(self, seq_len: float) -> float:
        """Bytes per sample at ``seq_len`` tokens."""
        return self.per_token * seq_len + self.per_token_squared * seq_len * seq_len

    def peak(self, batch_size: float, seq_len: float) -> float:
        return self.intercept + self.slope(seq_len) * batch_size

    def max_batch(self, seq_len: int, line_bytes: float, multiple: int = 1) -> int:
        """The largest multiple of ``multiple`` whose peak at ``seq_len`` stays at or under ``line_bytes``
        (0: none)."""
        slope = self.slope(seq_len)
        if slope <= 0 or not math.isfinite(slope):
            return 0
        room = (line_bytes - self.intercept) / slope
        return max(int(math.floor(room + 1e-9)) // multiple * multiple, 0)

    def longest(self, batch_size: int, line_bytes: float) -> int:
        """The longest length at which ``batch_size`` samples stay at or under ``line_bytes`` (0: none)."""
        room = (line_bytes - self.intercept) / batch_size
        if room <= 0:
            return 0
        b, c = self.per_token, self.per_token_squared
        if c <= 0:
            return int(room // b) if b > 0 else 0
        return int(math.floor((-b + math.sqrt(b * b + 4 * c * room)) / (2 * c) + 1e-9))

    def attention_share(self, seq_len: float) -> float:
        """The share of the activations per sample at ``seq_len`` that the ``L²`` term holds."""
        slope = self.slope(seq_len)
        return self.per_token_squared * seq_len * seq_len / slope if slope > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "intercept_bytes": round(self.intercept),
            "bytes_per_token": round(self.per_token, 3),
            "bytes_per_token_squared": round(self.per_token_squared, 6),
            "fitted_from": list(self.lengths),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Surface:
        return cls(
            float(data["intercept_bytes"]),
            float(data["bytes_per_token"]),
            float(data["bytes_per_token_squared"]),
            tuple(int(n) for n in data.get("fitted_from", ())),
        )


def fit(lines: Iterable[Line]) -> Surface | None:
    """The surface through the measured lines (None without a line of positive slope)."""
    usable = sorted((line for line in lines if line.slope > 0 and line.seq_len > 0), key=lambda x: x.seq_len)
    if not usable:
        return None
    intercept = sum(line.intercept for line in usable) / len(usable)
    lengths = tuple(line.seq_len for line in usable)
    b, c = _slopes(usable)
    return Surface(intercept, b, c, lengths)


def _slopes(lines: Sequence[Line]) -> tuple[float, float]:
    """Least squares of ``slope = b·L + c·L²`` (``c`` held at zero when one length, or when it comes out
    negative, which only noise can make)."""
    linear = sum(x.slope * x.seq_len for x in lines) / sum(x.seq_len**2 for x in lines)
    if len({x.seq_len for x in lines}) < 2:
        return linear, 0.0
    # normal equations over the basis (L, L²), scaled by the longest length to keep them well conditioned
    scale = float(max(x.seq_len for x in lines))
    s11 = s12 = s22 = t1 = t2 = 0.0
    for x in lines:
        u, v = x.seq_len / scale, (x.seq_len / scale) ** 2
        s11, s12, s22 = s11 + u * u, s12 + u * v, s22 + v * v
        t1, t2 = t1 + u * x.slope, t2 + v * x.slope
    det = s11 * s22 - s12 * s12
    if det <= 0:
        return linear, 0.0
    b_scaled = (t1 * s22 - t2 * s12) / det
    c_scaled = (s11 * t2 - s12 * t1) / det
    if c_scaled < 0 or b_scaled < 0:
        return linear, 0.0
    return b_scaled / scale, c_scaled / (scale * scale)


def prior_line(lines: Sequence[Line], seq_len: int) -> tuple[float, float, bool] | None:
    """The line ``(intercept, slope, slope_known)`` the surface of ``lines`` predicts at ``seq_len``: the
    nearest length's intercept, and the surface's slope. ``slope_known`` is False while one length alone
    cannot tell the linear term from the quadratic one (the slope is then scaled linearly: too steep for a
    shorter length with materialised attention, too shallow for a longer one); None without a line."""
    surface = fit(lines)
    if surface is None:
        return None
    nearest = min(lines, key=lambda line: (abs(line.seq_len - seq_len), -line.seq_len))
    return nearest.intercept, surface.slope(seq_len), len(surface.lengths) >= 2


#: Memory per sample that grows by less than this share of the length's growth did not see the length.
UNMOVED_GROWTH = 0.1


def unmoved(lines: Iterable[Line]) -> tuple[Line, Line] | None:
    """The shortest and the longest of ``lines`` when the memory per sample hardly grew between them, by less
    than :data:`UNMOVED_GROWTH` of the length's growth (None otherwise, or with one length). A sequence model
    keeps memory per token, so batches whose memory does not move with their length did not reach it: a run
    as it is whose data is shorter than the length asked, or that truncates to a maximum of its own."""
    usable = sorted((line for line in lines if line.slope > 0), key=lambda line: line.seq_len)
    if len(usable) < 2 or usable[-1].seq_len <= usable[0].seq_len:
        return None
    short, long = usable[0], usable[-1]
    if long.slope / short.slope - 1 < UNMOVED_GROWTH * (long.seq_len / short.seq_len - 1):
        return short, long
    return None


def token_budget(maxima: Mapping[int, int]) -> int | None:
    """The most tokens per micro-batch (``B·L``) that fit at every measured length: the least of
    ``max_batch(L)·L`` (None without a measured maximum)."""
    tokens = [batch * seq_len for seq_len, batch in maxima.items() if batch]
    return min(tokens) if tokens else None


def fit_error(
    surface: Surface, maxima: Mapping[int, int], line_bytes: float, multiple: int = 1
) -> float | None:
    """The largest relative difference between the surface's maximum and the measured one over the
    measured lengths (None without two lengths: one length's surface goes through it by construction)."""
    measured = {seq_len: batch for seq_len, batch in maxima.items() if batch}
    if len(measured) < 2:
        return None
    return max(
        abs(surface.max_batch(seq_len, line_bytes, multiple) - batch) / batch
        for seq_len, batch in measured.items()
    )


def between(lengths: Iterable[int]) -> list[int]:
    """The powers of two strictly between the shortest and the longest of ``lengths`` that are not among
    them: the lengths a table answers from the surface, marked as predicted."""
    searched = sorted(set(lengths))
    if len(searched) < 2:
        return []
    out, power = [], 1
    while power < searched[-1]:
        if power > searched[0] and power not in searched:
            out.append(power)
        power *= 2
    return out


def search_order(lengths: Iterable[int], first: int) -> list[int]:
    """The order lengths are searched in: ``first`` (the plan's), then the farthest from it, then the rest
    by distance (each later one between lengths already fitted, where the surface interpolates)."""
    rest = sorted(set(lengths) - {first}, key=lambda n: -abs(n - first))
    if len(rest) <= 1:
        return [first, *rest]
    return [first, rest[0], *sorted(rest[1:], key=lambda n: abs(n - first))]
