"""The parent side of ``explain --strategy ddp|fsdp``: the report's ``distributed`` section and the strategy lever.

The explain operation ran on every rank (:mod:`autobatch.explain.worker.distributed`); its outcome is the
worst rank's, with every rank's summary (:mod:`autobatch.explain.pure.per_rank`). The report shows the
worst rank's breakdown and adds::

    "distributed": {"strategy", "nproc_per_node", "shown_rank", "rank_peak_bytes": [...],
                    "ranks": [{"rank", "peak_bytes", "categories", "residual_bytes", "peak_phase"}]}
"""

from __future__ import annotations

from typing import Any

from autobatch.core.maximum import Limits
from autobatch.explain.pure.levers import Lever
from autobatch.explain.pure.per_rank import worst_rank
from autobatch.explain.pure.sharding_lever import offered, strategy_lever
from autobatch.records.protocol import ProbeOutcome
from autobatch.run.session import Session

#: Said under every strategy's breakdown.
RESIDUAL_NOTE = (
    "under {strategy}, the breakdown is rank {rank}'s (the largest peak of {world}); the process group "
    "(gloo on the CPU, NCCL on CUDA) is joined before the baseline is read, and the buffers its collectives "
    "use during the step are in the residual"
)


def distributed_section(session: Session, outcome: ProbeOutcome) -> dict[str, Any] | None:
    """The report's ``distributed`` section from the explained outcome (None without a strategy)."""
    if session.settings.distributed.strategy == "none":
        return None
    info = outcome.info
    ranks = list(info.get("ranks", []))
    peaks = list(outcome.rank_peak_bytes or [r["peak_bytes"] for r in ranks])
    shown = info.get("shown_rank")
    if shown is None:
        shown = outcome.failed_rank if outcome.failed_rank is not None else worst_rank(ranks)
    return {
        "strategy": session.settings.distributed.strategy,
        "nproc_per_node": session.ranks,
        "shown_rank": int(shown),
        "rank_peak_bytes": peaks,
        "ranks": ranks,
    }


def residual_note(section: dict[str, Any]) -> str:
    return RESIDUAL_NOTE.format(
        strategy=section["strategy"], rank=section["shown_rank"], world=section["nproc_per_node"]
    )


def estimate_fields(session: Session) -> dict[str, Any]:
    """``EstimateOptions`` fields that make the levers' simulations one rank of the strategy."""
    if session.settings.distributed.strategy == "none":
        return {}
    return {"strategy": session.settings.distributed.strategy, "world_size": session.ranks}


def add_strategy_lever(
    levers: list[Lever], section: dict[str, Any] | None, report: Any, limits: Limits
) -> None:
    """Append the strategy lever (computed from the shown rank's categories) when there is a strategy, and
    leave out the levers that cannot run under it (noted)."""
    if section is None:
        return
    now = levers[0]
    line = report.line  # the lever moves the now lever's predicted line down by its saving, if there is one
    if now.static_bytes is not None and now.bytes_per_sample is not None:
        line = {"static_bytes": now.static_bytes, "bytes_per_sample": now.bytes_per_sample}
    lever = strategy_lever(
        section["strategy"],
        section["nproc_per_node"],
        report.categories,
        line,
        (report.budget_bytes, limits.max_batch_size, limits.batch_multiple),
    )
    if lever is not None:
        levers.append(lever)
    kept, notes = offered(levers, section["strategy"])
    levers[:] = kept
    report.notes.extend(notes)
