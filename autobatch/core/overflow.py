"""Which of a data set's batches would run out of memory: the memory surface against the real lengths.

Given the lengths of every sequence in the order a loader reads them, and what a tune measured (:class:`Memory`:
its surface, :mod:`autobatch.core.lengths`, the line its maxima are measured against and the maxima themselves),
:func:`overflow` counts the batches whose peak crosses the line under padding (:func:`padded`, and
:func:`shuffled_share` for shuffled data) and under a token budget (:func:`by_tokens`). Pure functions over plain
numbers: no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
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


@dataclass(frozen=True)
class Measured:
    """What the tune measured at a searched length (the chosen combination's probes): the largest batch that fits
    (0: none) and its peak (None: not recorded), the smallest that ran out of memory (None: none did)."""

    seq_len: int
    max_batch: int
    peak_bytes: float | None = None
    oom_batch: int | None = None


@dataclass(frozen=True)
class Memory:
    """Whether ``B`` sequences of ``L`` tokens stay on the line, as the tune measured it: at a searched length the
    probes decide (a batch at or under the maximum fits there and at every shorter length, one at or over a batch
    that ran out of memory fits at no length from there on); between and past them the surface does, raised by
    :meth:`of` to pass at or over every peak measured. A least-squares surface passes under some measured peaks,
    and near a measured boundary that reads as room the measurement does not leave: 0.3 % under the peak of the
    plan's batch, it let that batch one token past the plan's length, where the peak left less than one token's
    memory below the line."""

    surface: Surface
    line_bytes: float
    measured: tuple[Measured, ...] = ()
    raised_bytes: float = 0.0  # how far the surface was raised above its fit

    @classmethod
    def of(cls, surface: Surface, line_bytes: float, measured: Sequence[Measured] = ()) -> Memory:
        """The surface raised by its largest shortfall under a measured peak (none: as fitted)."""
        shortfall = max(
            (
                m.peak_bytes - surface.peak(m.max_batch, m.seq_len)
                for m in measured
                if m.peak_bytes and m.max_batch
            ),
            default=0.0,
        )
        raised = max(shortfall, 0.0)
        lifted = replace(surface, intercept=surface.intercept + raised)
        return cls(lifted, line_bytes, tuple(measured), raised)

    def max_batch(self, seq_len: int, multiple: int = 1) -> int:
        """The largest multiple of ``multiple`` that stays on the line at ``seq_len`` tokens (0: none), as
        :meth:`critical_length` reads it: the raised surface's maximum, at least a maximum measured at a length at
        or over ``seq_len``, under every batch that ran out of memory at a length at or under it. The maxima a
        tune predicts between its searched lengths come from here, so that they agree with ``autobatch lengths``."""
        batch = self.surface.max_batch(seq_len, self.line_bytes, multiple)
        while batch > 0 and self.surface.peak(batch, seq_len) > self.line_bytes:  # the rounding's tolerance
            batch -= multiple
        batch = max([batch, *(m.max_batch for m in self.measured if m.seq_len >= seq_len)])
        ran_out = (m.oom_batch - 1 for m in self.measured if m.oom_batch is not None and m.seq_len <= seq_len)
        return max(min([batch, *ran_out]), 0) // multiple * multiple

    def critical_length(self, batch_size: int) -> int:
        """The longest length at which ``batch_size`` sequences stay on the line (0: not one token)."""
        length = critical_length(self.surface, batch_size, self.line_bytes)
        length = max([length, *(m.seq_len for m in self.measured if m.max_batch >= batch_size)])
        ran_out = (
            m.seq_len - 1 for m in self.measured if m.oom_batch is not None and m.oom_batch <= batch_size
        )
        return min([length, *ran_out])


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
    # the expected share of full batches that overflow when the data is shuffled; data smaller than one batch
    # is one batch in any order, and its share is the file order's
    shuffled_share: float
    first_overflowing_batch: int | None  # its index in reading order, from 0

    @property
    def share(self) -> float:
        return self.overflowing / self.batches if self.batches else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share": self.share}


def padded(lengths: Sequence[int], memory: Memory, batch_size: int) -> Padded:
    """Count the batches of ``batch_size`` consecutive ``lengths`` whose padded peak crosses the line."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    critical = {batch_size: memory.critical_length(batch_size)}
    batches = overflowing = 0
    first: int | None = None
    for start in range(0, len(lengths), batch_size):
        chunk = lengths[start : start + batch_size]
        size = len(chunk)
        if size not in critical:  # the last, smaller batch
            critical[size] = memory.critical_length(size)
        if max(chunk) > critical[size]:
            overflowing += 1
            first = batches if first is None else first
        batches += 1
    longest = critical[batch_size]
    # a shuffled batch is ``drawn`` sequences: the whole data when it is smaller than one batch, whose critical
    # length is its own (a full batch's would call 100 % the batch that file order, the same batch, counts 0 %)
    drawn = min(batch_size, len(lengths)) or batch_size
    short = sum(1 for n in lengths if n <= critical.get(drawn, longest))
    return Padded(
        batch_size=batch_size,
        batches=batches,
        overflowing=overflowing,
        longest_length=longest,
        long_sequences=sum(1 for n in lengths if n > longest),
        shuffled_share=shuffled_share(len(lengths), short, drawn),
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
    longest_length: int  # every length up to it survives in a full batch of max_tokens (0: not one token)
    first_overflowing_batch: int | None

    @property
    def share(self) -> float:
        return self.overflowing / self.batches if self.batches else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share": self.share}


def by_tokens(lengths: Sequence[int], memory: Memory, max_tokens: int) -> Tokens:
    """Count the greedy ``max_tokens`` batches of ``lengths`` whose peak crosses the line."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    batches = overflowing = unbatchable = 0
    first: int | None = None
    critical: dict[int, int] = {}  # by the count of a batch
    for count, longest in token_batches(lengths, max_tokens):
        alone = longest > max_tokens
        unbatchable += alone
        if count not in critical:
            critical[count] = memory.critical_length(count)
        if alone or longest > critical[count]:
            overflowing += 1
            first = batches if first is None else first
        batches += 1
    return Tokens(
        max_tokens=max_tokens,
        batches=batches,
        overflowing=overflowing,
        unbatchable=unbatchable,
        longest_length=longest_under_tokens(memory, max_tokens),
        first_overflowing_batch=first,
    )


def longest_under_tokens(memory: Memory, max_tokens: int) -> int:
    """The longest length ``L`` (at most ``max_tokens``) up to which every length survives in a full batch of
    ``max_tokens // L`` sequences (0: not one token): the length a budget is safe up to.

    The count steps down as the length grows, so the peak is a saw-tooth in ``L``, rising within each run of
    lengths that share a count and falling where the count steps down: a length past the first that fails can
    fit again (at a budget of 14,080 tokens, 265 tokens in batches of 53 failed where 272 in batches of 51 fit),
    and the longest length that fits is not one the budget survives up to. Runs are visited from the shortest
    lengths (count ``max_tokens``) up; the first run with a length that fails holds the answer, the length before
    it.
    """
    length = 1
    while length <= max_tokens:
        count = max_tokens // length
        top = max_tokens // count  # the longest length with this count
        survives = memory.critical_length(count)
        if survives < top:
            return max(survives, length - 1)
        length = top + 1
    return max_tokens


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
    memory: Memory,
    *,
    batch_size: int | None,
    max_tokens: int | None,
) -> Overflow:
    """Every figure of :class:`Overflow` for ``lengths`` in reading order (a scheme given None is left out)."""
    if not lengths:
        raise ValueError("no lengths")
    return Overflow(
        spread=spread(lengths),
        padded=None if batch_size is None else padded(lengths, memory, batch_size),
        tokens=None if max_tokens is None else by_tokens(lengths, memory, max_tokens),
    )
