"""The accumulation plan (micro-batch x accumulation steps x devices = global batch) and the
choice among searched combinations.

Pure arithmetic: the runner feeds it each combination's maximum and measured throughput; the
emitters render the resulting :class:`Plan` into launcher configs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autobatch.core.space import OBJECTIVES
from autobatch.errors import UsageError

__all__ = ["Candidate", "Plan", "choose", "knee", "plan_accumulation", "plan_with_script_accumulation"]


@dataclass(frozen=True)
class Plan:
    """How to reach a global batch: ``micro_batch_size * accumulation_steps * world_size``."""

    micro_batch_size: int
    accumulation_steps: int
    world_size: int
    global_batch_size: int  # effective: micro * accumulation * world
    requested_global_batch_size: int | None
    exact: bool  # the effective global batch is the requested one
    note: str | None  # why the plan is not what was asked, and what it means for the learning rate


def plan_accumulation(
    max_micro_batch: int, global_batch_size: int | None, world_size: int = 1, batch_multiple: int = 1
) -> Plan:
    """Split ``global_batch_size`` into micro-batch x accumulation steps x ``world_size``.

    Without a global batch: the largest micro-batch, no accumulation. Otherwise the split with
    ``m * world_size * s == global_batch_size``, ``m <= max_micro_batch`` (a multiple of
    ``batch_multiple`` when such an exact split exists) and ``s`` minimal. When none is exact
    (the world size does not divide the global batch), the closest: least deviation, then fewest
    steps, then not above the request; the note gives the reason, the deviation and the
    learning-rate consequence.
    """
    for name, value in (
        ("max_micro_batch", max_micro_batch),
        ("world_size", world_size),
        ("batch_multiple", batch_multiple),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if global_batch_size is None:
        return Plan(max_micro_batch, 1, world_size, max_micro_batch * world_size, None, True, None)
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be a positive integer, got {global_batch_size!r}")

    g, w = global_batch_size, world_size
    best: tuple[tuple[int, bool, int, bool], int, int] | None = None
    for m in range(1, min(max_micro_batch, -(-g // w)) + 1):
        floor_steps = max(1, g // (m * w))
        for s in (floor_steps, floor_steps + 1):
            total = m * w * s
            key = (abs(total - g), m % batch_multiple != 0, s, total > g)
            if best is None or key < best[0]:
                best = (key, m, s)
    assert best is not None  # m == 1 is always a candidate
    (deviation, off_multiple, _, _), m, s = best
    effective = m * w * s
    notes: list[str] = []
    if deviation:
        if g < w:
            notes.append(
                f"requested global batch {g} is smaller than world size {w}: every device needs a sample"
            )
        else:
            notes.append(f"{g} is not divisible by world size {w}")
        notes.append(_lr_note(effective, g))
    elif off_multiple:
        notes.append(
            f"micro-batch {m} is not a multiple of {batch_multiple}: no multiple of {batch_multiple} "
            f"up to {max_micro_batch} splits {g} exactly over {w} device(s)"
        )
    fewest = -(-g // (w * max_micro_batch))
    if not deviation and s > 2 * fewest:
        alt_m = min(max_micro_batch, max(1, round(g / (w * fewest))))
        alt = alt_m * w * fewest
        notes.append(
            f"the exact split needs {s} accumulation steps of micro-batch {m}; "
            f"{alt_m} x {fewest} steps x {w} device(s) = {alt} ({_percent(alt, g)}) would need {fewest}"
        )
    return Plan(m, s, w, effective, g, deviation == 0, "; ".join(notes) or None)


def plan_with_script_accumulation(
    max_micro_batch: int,
    global_batch_size: int | None,
    world_size: int,
    batch_multiple: int,
    own: int,
    settable: bool,
) -> Plan:
    """The plan of a script run as it is that accumulates ``own`` micro-batches per optimizer step of its own
    (its backward passes per step), so that micro-batch x accumulation x world is the global batch asked for.

    The plan's ``accumulation_steps`` counts every micro-batch of an optimizer step: ``own`` times what the plan
    gives the script through ``{accum}`` when its arguments have one (``settable``: the script then accumulates
    ``own`` times that), ``own`` itself when they have none (nothing else can reach the script). A global batch
    no such split reaches is refused with the arithmetic (:class:`~autobatch.errors.UsageError`)."""
    if global_batch_size is None:
        m = max_micro_batch
        return Plan(m, own, world_size, m * own * world_size, None, True, None)
    g, w = global_batch_size, world_size
    if settable and g % own == 0:
        inner = plan_accumulation(max_micro_batch, g // own, w, batch_multiple)
        s = inner.accumulation_steps
        return Plan(
            inner.micro_batch_size, s * own, w, inner.global_batch_size * own, g, inner.exact, inner.note
        )
    micro, rest = divmod(g, own * w)
    if not rest and micro <= max_micro_batch:
        return Plan(micro, own, w, g, g, True, None)
    why = (
        f"needs micro-batch {micro}, above the maximum {max_micro_batch}"
        if not rest
        else f"is not a multiple of {own} x {w} = {own * w}"
    )
    largest = own * w * max_micro_batch
    raise UsageError(
        f"global batch {g} = micro-batch x {own} (the script's own accumulation: {own} backward passes per optimizer "
        f"step) x world {w} {why}",
        hint=(
            f"ask for a global batch that is a multiple of {own * w} up to {largest} (--global-batch-size), "
            "or let the plan set the script's accumulation: put {accum} where the script takes it in its "
            "arguments (-- ... --accumulate {accum}), which each probe runs at 1"
            if not settable
            else f"ask for a global batch that is a multiple of {own} (--global-batch-size)"
        ),
    )


def _percent(effective: int, requested: int) -> str:
    return f"{(effective - requested) / requested * 100:+.1f}%"


def _lr_note(effective: int, requested: int) -> str:
    return (
        f"effective global batch {effective} differs from requested {requested} ({_percent(effective, requested)}); "
        f"scale the learning rate by {effective}/{requested} (linear rule) "
        f"or by sqrt({effective}/{requested}) for Adam-type optimizers"
    )


def knee(points: Sequence[tuple[int, float]], tolerance: float = 0.05) -> int | None:
    """The smallest batch whose samples/s is within ``tolerance`` of the best; None without data.

    Beyond the knee a larger micro-batch buys little speed, while a smaller one leaves room for
    longer sequences or a safety margin.
    """
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    valid = [(b, t) for b, t in points if t is not None and math.isfinite(t) and t > 0]
    if not valid:
        return None
    best = max(t for _, t in valid)
    return min(b for b, t in valid if t >= (1 - tolerance) * best)


@dataclass(frozen=True)
class Candidate:
    """One searched combination, as :func:`choose` sees it."""

    index: int  # position in the user's order (precisions, then optimizers, then recompute)
    max_batch_size: int | None  # None: infeasible
    samples_per_second: float | None  # per device, measured at the planned micro-batch
    plan: Plan | None


def choose(candidates: Sequence[Candidate], objective: str) -> int | None:
    """The winning ``Candidate.index`` under ``objective``; None if no candidate is feasible.

    "max-batch": the largest maximum. "throughput": the least time per effective global sample,
    i.e. the highest samples/s times world size; candidates without a measurement rank after
    the measured ones, by maximum (so with no measurement at all this is "max-batch").
    Ties go to the lower index (the user's order).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    feasible = [c for c in candidates if c.max_batch_size is not None and c.max_batch_size > 0]
    if not feasible:
        return None

    def by_max_batch(c: Candidate) -> tuple[int, int]:
        assert c.max_batch_size is not None
        return (-c.max_batch_size, c.index)

    if objective == "max-batch":
        return min(feasible, key=by_max_batch).index

    def by_throughput(c: Candidate) -> tuple[int, float, int, int]:
        sps = c.samples_per_second
        if sps is None or not math.isfinite(sps) or sps <= 0:
            return (1, 0.0, *by_max_batch(c))
        rate = sps * (c.plan.world_size if c.plan is not None else 1)
        return (0, -rate, 0, c.index)

    return min(feasible, key=by_throughput).index
