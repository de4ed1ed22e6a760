"""The runtime guard's policy: which micro-batch sizes it may use, when it lowers, when it grows back.

A :class:`Ladder` is a plain value. Its rungs are the tuned curve's sizes that fitted (or sizes given
directly), the tuned maximum, and halvings of the smallest down to 1. An out-of-memory failure lowers it one
rung; a size that fails ``max_failures`` times is never tried again (the ceiling drops below it). After
``grow_after`` clean steps it climbs one rung, up to the ceiling. A step that only fitted after the
allocator flushed its cache (CUDA's ``num_alloc_retries``) is not clean, and ``retry_limit`` such steps in a
row lower it like a failure. The runtime (:mod:`autobatch.guard`) feeds it one outcome per global batch,
agreed by every rank, so every rank's ladder moves the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Reason = Literal["out of memory", "allocator retries", "grow"]


@dataclass(frozen=True)
class LadderSettings:
    """How the guard moves: ``grow_after`` clean steps before it tries the next larger size; a size that ran
    out ``max_failures`` times is not tried again; ``retry_limit`` steps in a row with allocator retries
    lower it like a failure."""

    grow_after: int = 25
    max_failures: int = 2
    retry_limit: int = 2

    def __post_init__(self) -> None:
        for name in ("grow_after", "max_failures", "retry_limit"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def rungs(fitted: Iterable[int], maximum: int) -> tuple[int, ...]:
    """The sizes a guard may use, ascending: every fitted size up to ``maximum``, ``maximum`` itself, and
    halvings of the smallest of those down to 1 (below the tuned curve nothing is known, so it halves)."""
    if maximum < 1:
        raise ValueError(f"the maximum micro-batch must be >= 1, got {maximum}")
    sizes = {size for size in fitted if 1 <= size <= maximum} | {maximum}
    smallest = min(sizes)
    while smallest > 1:
        smallest //= 2
        sizes.add(max(smallest, 1))
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class Move:
    """One change of the micro-batch size, and why."""

    old: int
    new: int
    reason: Reason


@dataclass(frozen=True)
class Ladder:
    """Where the guard stands: the rungs, the current size, the ceiling it may grow to, and its counts."""

    sizes: tuple[int, ...]
    size: int
    ceiling: int
    settings: LadderSettings = field(default_factory=LadderSettings)
    clean: int = 0  # clean steps since the last move (or the last step with retries)
    retried: int = 0  # steps in a row with allocator retries
    failures: tuple[tuple[int, int], ...] = ()  # (size, times it ran out), sizes ascending

    @classmethod
    def start(cls, sizes: Iterable[int], size: int, settings: LadderSettings | None = None) -> Ladder:
        """A ladder at ``size`` (which joins the rungs), allowed to grow up to the largest rung."""
        every = tuple(sorted(set(sizes) | {size}))
        if every[0] < 1:
            raise ValueError(f"micro-batch sizes must be >= 1, got {every[0]}")
        return cls(every, size, every[-1], settings or LadderSettings())

    def state(self) -> dict[str, Any]:
        """Where it stands, as plain values (for a job's checkpoint); :meth:`resumed` takes it back."""
        return {
            "micro_batch_size": self.size,
            "ceiling": self.ceiling,
            "clean": self.clean,
            "retried": self.retried,
            "failures": [list(pair) for pair in self.failures],
        }

    def resumed(self, state: Mapping[str, Any]) -> Ladder:
        """This ladder where :meth:`state` left one (its size and ceiling join the rungs); KeyError, TypeError
        or ValueError for what :meth:`state` did not write."""
        size, ceiling = int(state["micro_batch_size"]), int(state["ceiling"])
        if not 1 <= size <= ceiling:
            raise ValueError(f"micro-batch {size} and ceiling {ceiling} are not 1 <= size <= ceiling")
        return replace(
            self,
            sizes=tuple(sorted(set(self.sizes) | {size, ceiling})),
            size=size,
            ceiling=ceiling,
            clean=int(state.get("clean", 0)),
            retried=int(state.get("retried", 0)),
            failures=tuple(sorted((int(k), int(v)) for k, v in state.get("failures", []))),
        )

    def failures_at(self, size: int) -> int:
        return dict(self.failures).get(size, 0)

    @property
    def lowest(self) -> bool:
        """True at the smallest rung: nowhere left to lower to."""
        return self.size == self.sizes[0]

    def below(self, size: int) -> int | None:
        return next((s for s in reversed(self.sizes) if s < size), None)

    def above(self, size: int) -> int | None:
        return next((s for s in self.sizes if s > size), None)


def lower(ladder: Ladder, reason: Reason = "out of memory") -> tuple[Ladder, Move] | None:
    """The ladder after a failure at its size, and the move; None at the smallest rung (nowhere to go).

    The failure counts against the size; at ``max_failures`` the ceiling drops below it for good."""
    new = ladder.below(ladder.size)
    if new is None:
        return None
    counts = dict(ladder.failures)
    counts[ladder.size] = counts.get(ladder.size, 0) + 1
    ceiling = ladder.ceiling
    if counts[ladder.size] >= ladder.settings.max_failures:
        ceiling = min(ceiling, new)
    moved = replace(
        ladder, size=new, ceiling=ceiling, clean=0, retried=0, failures=tuple(sorted(counts.items()))
    )
    return moved, Move(ladder.size, new, reason)


def after_step(ladder: Ladder, retries: bool = False) -> tuple[Ladder, Move | None]:
    """The ladder after a global batch that completed (``retries``: only after the allocator flushed its
    cache), and the move it makes now, if any: lower after ``retry_limit`` such steps in a row, grow after
    ``grow_after`` clean ones."""
    if retries:
        retried = ladder.retried + 1
        if retried >= ladder.settings.retry_limit:
            lowered = lower(ladder, "allocator retries")
            if lowered is not None:
                return lowered
        return replace(ladder, clean=0, retried=retried), None
    clean = ladder.clean + 1
    if clean >= ladder.settings.grow_after:
        up = ladder.above(ladder.size)
        if up is not None and up <= ladder.ceiling:
            return replace(ladder, size=up, clean=0, retried=0), Move(ladder.size, up, "grow")
    return replace(ladder, clean=clean, retried=0), None


__all__ = ["Ladder", "LadderSettings", "Move", "Reason", "after_step", "lower", "rungs"]
