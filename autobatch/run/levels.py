"""The partial recomputation level of a tune: which K of the N blocks, chosen once ``off`` and ``full`` are
measured, and the prior its search starts from.

The grid lists ``partial`` last among the levels of each precision, optimizer and compile
(:func:`autobatch.settings.values`), so that when its turn comes the lines of ``off`` and ``full`` are known.
Memory falls about linearly in the blocks checkpointed, so those two lines predict every ``K/N``
(:func:`autobatch.core.levels.partial_line`). The K is the fewest blocks whose predicted maximum reaches the
micro-batch of ``full``'s plan (the fewest accumulation steps any level reaches), or the middle K when no plan
binds (no global batch). At that micro-batch the partial level does strictly less work than ``full``, which the
choice then drops (:func:`autobatch.core.choice.dominated`): what is timed is the least recomputation that
reaches the plan against ``off`` accumulating more steps. Only that K is searched, from the predicted line: at
most three probes, its confirmation included, when the prediction holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autobatch.core.levels import FULL, OFF, partial_for, partial_line
from autobatch.core.model import Affine
from autobatch.core.plan import plan_accumulation
from autobatch.core.reuse import Prediction
from autobatch.core.space import Combo, Ident
from autobatch.run.options import TuneOptions


@dataclass(frozen=True)
class Partial:
    """The resolved partial level: its combination and prior, or why there is none (``skip``)."""

    combo: Combo | None = None
    prior: Prediction | None = None
    skip: str | None = None
    target: int | None = None  # the micro-batch it is for (None: no plan binds)


def resolve(
    combo: Combo,
    lines: dict[Ident, Affine],
    maxima: dict[Ident, int | None],
    blocks: int,
    options: TuneOptions,
    line_bytes: float,
    at_least: int = 1,
) -> Partial:
    """The ``K/N`` level the partial combination ``combo`` stands for (see the module docstring), K at least
    ``at_least`` (the neighbour of a K whose measured maximum fell short of the prediction)."""
    off, full = (combo.with_level(level).ident for level in (OFF, FULL))
    if blocks < 2:
        return Partial(skip=f"{blocks} repeated block(s): no level lies between off and full")
    if off not in lines or full not in lines:
        missing = " and ".join(level for level, key in ((OFF, off), (FULL, full)) if key not in lines)
        return Partial(skip=f"the partial level is chosen from the lines of off and full; {missing} has none")
    off_max = maxima.get(off)
    target = None
    if off_max and options.global_batch_size is not None:
        target = _full_plans(lines[full], maxima.get(full), options, line_bytes)
        if target <= off_max:
            return Partial(
                skip=f"off already runs micro-batch {target}, the one full recomputation plans: no level "
                "between them plans fewer accumulation steps"
            )
    low, high = (lines[off].intercept, lines[off].slope), (lines[full].intercept, lines[full].slope)
    k = partial_for(low, high, blocks, target, line_bytes)
    k = None if k is None or max(k, at_least) >= blocks else max(k, at_least)
    if k is None:
        return Partial(skip=f"no level between off and full reaches micro-batch {target}: only full may")
    intercept, slope = partial_line(low, high, k, blocks)
    why = f"micro-batch {target}, full recomputation's plan" if target else "the middle K: no plan binds"
    if at_least > 1:
        why += f"; {at_least - 1}/{blocks} measured short of it"
    prior = Prediction(
        intercept,
        slope,
        f"the line {k}/{blocks} of the way from off to full ({why})",
        of_readings=lines[off].of_readings,
    )
    return Partial(combo.with_level(f"{k}/{blocks}"), prior, target=target)


def _full_plans(full: Affine, maximum: int | None, options: TuneOptions, line_bytes: float) -> int:
    """The micro-batch of ``full``'s plan: from its maximum, or from its line when it has none."""
    limits = options.limits
    if not maximum:
        reach = (line_bytes - full.intercept) / full.slope if full.slope > 0 else limits.max_batch_size
        maximum = max(1, min(limits.max_batch_size, math.floor(reach)))
    return plan_accumulation(
        maximum, options.global_batch_size, options.world_size, limits.batch_multiple
    ).micro_batch_size
