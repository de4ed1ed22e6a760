"""Which of a data set's batches would run out of memory: the memory surface against the real lengths.

Given the lengths of every sequence in the order a loader reads them, and a tune's surface
(:mod:`autobatch.core.lengths`) with the line its maxima are measured against, :func:`overflow` counts the
batches whose peak crosses the line under padding (:func:`padded`, and :func:`shuffled_share` for shuffled
data) and under a token budget (:func:`by_tokens`). Pure functions over plain numbers: no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from autobatch.core.lengths import Surface


@dataclass(frozen=True)
class Spread:
    """The distribution of the lengths: their count, mean, and nearest-rank percentiles (tokens)."""

    count: int
    mean: float
    min: int
    p50: int
    p90: int
    p99: int
    max: int

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mean": round(self.mean, 2)}


def percentile(ordered: Sequence[int], share: float) -> int:
    """The nearest-rank percentile of ascending ``ordered``: the least length that ``share`` of them (0-1)
    are at or under (a length that occurs in the data, never an interpolation)."""
    if not ordered:
        raise ValueError("no lengths")
    rank = max(math.ceil(share * len(ordered) - 1e-9), 1)
    return ordered[min(rank, len(ordered)) - 1]


def spread(lengths: Sequence[int]) -> Spread:
    """The distribution of ``lengths`` (at least one)."""
    ordered = sorted(lengths)
    return Spread(
        count=len(ordered),
        mean=sum(ordered) / len(ordered),
        min=ordered[0],
        p50=percentile(ordered, 0.50),
        p90=percentile(ordered, 0.90),
        p99=percentile(ordered, 0.99),
        max=ordered[-1],
    )


def critical_length(surface: Surface, batch_size: int, line_bytes: float) -> int:
    """The longest length at which ``batch_size`` sequences stay at or under ``line_bytes``: ``surface.longest``
    moved by the rounding of its square root, so that it agrees with ``surface.peak`` on both sides."""
    if surface.per_token < 0 or surface.per_token_squared < 0 or surface.slope(1) <= 0:
        raise ValueError("the surface must grow with the length (bytes per token >= 0, one of them > 0)")
    if surface.peak(batch_size, 0) > line_bytes:
        return 0
    length = surface.longest(batch_size, line_bytes)
    while length > 0 and surface.peak(batch_size, length) > line_bytes:
        length -= 1
    while surface.peak(batch_size, length + 1) <= line_bytes:
        length += 1
    return length


def shuffled_share(total: int, short: int, batch_size: int) -> float:
    """The chance that a batch of ``batch_size`` sequences drawn without replacement from ``total``, of which
    ``short`` are at or under the critical length, holds a longer one: ``1 - C(short, B)/C(total, B)``.

    The ratio is the product of ``(short - i)/(total - i)`` over ``i < B``, summed in logarithms
    (``log1p``, exact for a ratio near 1) and taken from 1 with ``expm1``, so a share of 1e-12 is not lost
    to rounding. A batch larger than the data is the whole data.
    """
    if not 0 <= short <= total:
        raise ValueError(f"short ({short}) must lie within 0 and total ({total})")
    size = min(batch_size, total)
    if short == total or size == 0:
        return 0.0
    if short < size:
        return 1.0
    long = total - short
    log_ratio = sum(math.log1p(-long / (total - i)) for i in range(size))
    return -math.expm1(log_ratio)


@dataclass(frozen=True)
class Padded:
    """Batches of ``batch_size`` consecutive sequences, each padded to its longest."""

    batch_size: int
    batches: int
    overflowing: int
    longest_length: int  # the longest length a full batch survives (0: not even one token)
    long_sequences: int  # sequences longer than that
    shuffled_share: float  # the expected share of full batches that overflow when the data is shuffled
    first_overflowing_batch: int | None  # its index in reading order, from 0

    @property
    def share(self) -> float:
        return self.overflowing / self.batches if self.batches else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share": self.share}


def padded(lengths: Sequence[int], surface: Surface, line_bytes: float, batch_size: int) -> Padded:
    """Count the batches of ``batch_size`` consecutive ``lengths`` whose padded peak crosses ``line_bytes``."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    critical = {batch_size: critical_length(surface, batch_size, line_bytes)}
    batches = overflowing = 0
    first: int | None = None
    for start in range(0, len(lengths), batch_size):
        chunk = lengths[start : start + batch_size]
        size = len(chunk)
        if size not in critical:  # the last, smaller batch
            critical[size] = critical_length(surface, size, line_bytes)
        if max(chunk) > critical[size]:
            overflowing += 1
            first = batches if first is None else first
        batches += 1
    longest = critical[batch_size]
    short = sum(1 for n in lengths if n <= longest)
    return Padded(
        batch_size=batch_size,
        batches=batches,
        overflowing=overflowing,
        longest_length=longest,
        long_sequences=len(lengths) - short,
        shuffled_share=shuffled_share(len(lengths), short, batch_size),
        first_overflowing_batch=first,
    )


def token_batches(lengths: Sequence[int], max_tokens: int) -> Iterator[tuple[int, int]]:
    """The batches a greedy ``max_tokens`` sampler makes of ``lengths`` in order, as ``(count, longest)``:
    a sequence joins the batch while ``(count + 1) x max(longest, its length)`` stays within ``max_tokens``,
    else it starts the next. A sequence longer than ``max_tokens`` is a batch of its own (one that cannot be
    made: the caller counts it as overflowing)."""
    count = longest = 0
    for length in lengths:
        wider = max(longest, length)
        if count and (count + 1) * wider <= max_tokens:
            count, longest = count + 1, wider
            continue
        if count:
            yield count, longest
        count, longest = 1, length
        if length > max_tokens:
            yield 1, length
            count = longest = 0
    if count:
        yield count, longest


@dataclass(frozen=True)
class Tokens:
    """Batches of at most ``max_tokens`` padded tokens, grouped greedily in reading order."""

    max_tokens: int
    batches: int
    overflowing: int  # unbatchable sequences included
    unbatchable: int  # sequences longer than max_tokens
    longest_length: int  # the longest length at which a full batch of max_tokens survives
    first_overflowing_batch: int | None

    @property
    def share(self) -> float:
        return self.overflowing / self.batches if self.batches else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share": self.share}


def by_tokens(lengths: Sequence[int], surface: Surface, line_bytes: float, max_tokens: int) -> Tokens:
    """Count the greedy ``max_tokens`` batches of ``lengths`` whose peak crosses ``line_bytes``."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    batches = overflowing = unbatchable = 0
    first: int | None = None
    for count, longest in token_batches(lengths, max_tokens):
        alone = longest > max_tokens
        unbatchable += alone
        if alone or surface.peak(count, longest) > line_bytes:
            overflowing += 1
            first = batches if first is None else first
        batches += 1
    return Tokens(
        max_tokens=max_tokens,
        batches=batches,
        overflowing=overflowing,
        unbatchable=unbatchable,
        longest_length=longest_under_tokens(surface, line_bytes, max_tokens),
        first_overflowing_batch=first,
    )


def longest_under_tokens(surface: Surface, line_bytes: float, max_tokens: int) -> int:
    """The longest length ``L`` (at most ``max_tokens``) at which a full batch of ``max_tokens // L``
    sequences stays at or under ``line_bytes`` (0: none).

    The count steps down as ``L`` grows, so the peak is a saw-tooth in ``L``, rising within each run of
    lengths that share a count. Runs are visited from the longest lengths (count 1) down; the first run
    whose shortest length fits holds the answer, the longest length of the run the count survives.
    """
    count = 1
    while count <= max_tokens:
        top = max_tokens // count  # the longest length with this count
        bottom = max_tokens // (count + 1) + 1  # the shortest
        survives = min(top, critical_length(surface, count, line_bytes))
        if survives >= bottom:
            return survives
        count = max_tokens // (bottom - 1) if bottom > 1 else max_tokens + 1  # the next run's count
    return 0


@dataclass(frozen=True)
class Overflow:
    """The distribution of the lengths, and the batches that overflow under padding and under tokens."""

    spread: Spread
    padded: Padded | None
    tokens: Tokens | None

    @property
    def overflows(self) -> bool:
        return any(part is not None and part.overflowing for part in (self.padded, self.tokens))


def overflow(
    lengths: Sequence[int],
    surface: Surface,
    line_bytes: float,
    *,
    batch_size: int | None,
    max_tokens: int | None,
) -> Overflow:
    """Every figure of :class:`Overflow` for ``lengths`` in reading order (a scheme given None is left out)."""
    if not lengths:
        raise ValueError("no lengths")
    return Overflow(
        spread=spread(lengths),
        padded=None if batch_size is None else padded(lengths, surface, line_bytes, batch_size),
        tokens=None if max_tokens is None else by_tokens(lengths, surface, line_bytes, max_tokens),
    )
