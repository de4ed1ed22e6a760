"""The parent side of explain and estimate: send their operations to a probe server, search real maxima.

Nothing here imports torch: requests and outcomes are plain records (:mod:`autobatch.probe.protocol`),
options are typed records (:mod:`autobatch.explain.pure.options`), and every tensor operation happens in a
forked probe process (:mod:`autobatch.explain.worker.ops`, which the session's probe server imports because
it is started with ``op_modules=OP_MODULES``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.search import KINDS, Affine, Observation, search_max_batch
from ...core.space import Combo
from ...probe.protocol import ProbeOutcome
from ...session import Session
from ..pure.options import EXPLAIN, ExplainOptions
from ..pure.records import Transforms


@dataclass(frozen=True)
class Limits:
    """The search range and the probe lengths (from settings)."""

    max_batch_size: int = 65536
    batch_multiple: int = 1
    steps: int = 3
    max_steps: int = 8
    confirm_steps: int = 10


@dataclass
class Measured:
    """A maximum measured with real probes (``status`` as the search's)."""

    max_batch_size: int | None
    status: str
    probes: int = 0
    trace: list[dict[str, Any]] = field(default_factory=list)
    peak_bytes: int | None = None


def explain_probe(
    session: Session, combo: Combo, batch_size: int, *, budget_bytes: int | None, steps: tuple[int, int]
) -> ProbeOutcome:
    """One instrumented real run (``op="explain"``)."""
    options = ExplainOptions().to_dict()
    request = session.request(
        combo, batch_size, op=EXPLAIN, options=options, budget_bytes=budget_bytes, steps=steps
    )
    return session.run(request, what=f"explaining {combo.key} at batch {batch_size}")


def measure(
    session: Session, combo: Combo, batch_size: int, transforms: Transforms, steps: tuple[int, int]
) -> ProbeOutcome:
    """A real probe; with model transforms it goes through ``op="explain"`` without instrumentation."""
    if not transforms.active:
        return session.probe(combo, batch_size, min_steps=steps[0], max_steps=steps[1])
    options = ExplainOptions(instrument=False, transforms=transforms).to_dict()
    request = session.request(combo, batch_size, op=EXPLAIN, options=options, steps=steps)
    return session.run(request, what=f"{combo.key} at batch {batch_size} with {transforms}")


def measure_max(
    session: Session,
    combo: Combo,
    transforms: Transforms,
    limits: Limits,
    *,
    prior: Affine | None = None,
    on_probe: Callable[[ProbeOutcome], None] | None = None,
) -> Measured:
    """The exact largest batch that fits, searched and confirmed as ``tune`` does."""
    assert session.device is not None
    records: list[dict[str, Any]] = []
    peaks: dict[int, int | None] = {}

    def run(batch: int, steps: tuple[int, int]) -> ProbeOutcome:
        outcome = measure(session, combo, batch, transforms, steps)
        records.append({"batch_size": batch, "kind": outcome.kind, "peak_bytes": outcome.peak_bytes})
        peaks[batch] = outcome.peak_bytes if outcome.fits else None
        if on_probe:
            on_probe(outcome)
        return outcome

    def probe(batch: int) -> Observation:
        outcome = run(batch, (limits.steps, limits.max_steps))
        kind = outcome.kind if outcome.kind in KINDS else "crash"
        return Observation(batch, outcome.fits, outcome.peak_bytes if outcome.fits else None, kind=kind)

    known: list[Observation] = []
    status, best = "infeasible", None
    for _round in range(4):
        result = search_max_batch(
            probe,
            budget_bytes=session.device.budget_bytes,
            max_batch_size=limits.max_batch_size,
            batch_multiple=limits.batch_multiple,
            prior=prior,
            known=known,
        )
        known = [*known, *result.trace]
        status, best = result.status, result.max_batch_size
        if best is None:
            break
        confirm = run(best, (limits.confirm_steps, limits.confirm_steps))
        if confirm.fits:
            break
        known.append(Observation(best, False, kind="oom"))
    return Measured(best, status, len(records), records, peaks.get(best) if best else None)
