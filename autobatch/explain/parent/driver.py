"""The parent side of explain and estimate: send their operations to a probe server, search real maxima.

Nothing here imports torch: requests and outcomes are plain records (:mod:`autobatch.records.protocol`),
options are typed records (:mod:`autobatch.explain.pure.options`), and every tensor operation happens in a
forked probe process (:mod:`autobatch.explain.worker.ops`, which the session's probe server imports because
it is started with ``op_modules=OP_MODULES``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autobatch.core.maximum import Limits, find_maximum
from autobatch.core.reuse import Prediction
from autobatch.core.search import Affine, Observation
from autobatch.core.space import Combo
from autobatch.explain.pure.options import EXPLAIN, ExplainOptions
from autobatch.explain.pure.records import Transforms
from autobatch.records.protocol import ProbeOutcome
from autobatch.records.readings import observation
from autobatch.run.session import Session


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
    """The exact largest batch that fits, searched and confirmed by tune's own procedure
    (:func:`autobatch.core.maximum.find_maximum`), with the lever's predicted line as a known prior."""
    assert session.device is not None
    records: list[dict[str, Any]] = []
    peaks: dict[int, int | None] = {}

    def probe(batch: int, steps: tuple[int, int], _purpose: str) -> Observation:
        outcome = measure(session, combo, batch, transforms, steps)
        records.append({"batch_size": batch, "kind": outcome.kind, "peak_bytes": outcome.peak_bytes})
        if outcome.fits or batch not in peaks:
            peaks[batch] = outcome.peak_bytes if outcome.fits else None
        if on_probe:
            on_probe(outcome)
        return observation(outcome)

    prediction = Prediction(prior.intercept, prior.slope, "lever prediction") if prior is not None else None
    found = find_maximum(
        probe, budget_bytes=session.device.budget_bytes, limits=limits, prediction=prediction
    )
    best = found.max_batch_size
    return Measured(best, found.status, len(records), records, peaks.get(best) if best else None)
