"""The ranks of ``explain --strategy ddp|fsdp``: every rank's breakdown, the worst one shown (no torch here).

Each rank of a distributed explain reports its own breakdown (:mod:`autobatch.explain.worker.distributed`);
the group's outcome is the worst rank's (the largest peak: the one that decides whether a batch fits)
and :func:`merge_ranks` adds, to its ``info``:

``ranks``       one summary per rank, in rank order: ``rank``, ``peak_bytes``, ``categories``,
                ``residual_bytes``, ``peak_phase``
``shown_rank``  the rank whose full breakdown (categories, modules, phase) the report shows
"""

from __future__ import annotations

from typing import Any

from autobatch.records.protocol import ProbeOutcome


def rank_summary(info: dict[str, Any], peak_bytes: int | None) -> dict[str, Any]:
    """One rank's figures, small enough to travel beside the shown rank's full breakdown."""
    return {
        "rank": int(info.get("rank", 0)),
        "peak_bytes": int(peak_bytes or 0),
        "categories": {k: int(v) for k, v in dict(info.get("categories", {})).items()},
        "residual_bytes": int(info.get("residual_bytes", 0)),
        "peak_phase": str(info.get("peak_phase", "")),
    }


def merge_ranks(out: ProbeOutcome, outcomes: list[ProbeOutcome]) -> None:
    """Every rank's summary and the shown rank into ``out.info`` (``out``: the worst rank's outcome, as
    :func:`autobatch.probe.ranks.combine` made it)."""
    summaries = sorted(
        (o.info.get("rank_summary") or rank_summary(o.info, o.peak_bytes) for o in outcomes),
        key=lambda s: s["rank"],
    )
    info = {k: v for k, v in out.info.items() if k != "rank_summary"}
    info["ranks"] = summaries
    info["shown_rank"] = int(info.get("rank", worst_rank(summaries)))
    out.info = info


def worst_rank(summaries: list[dict[str, Any]]) -> int:
    """The rank with the largest peak (the lowest such rank on a tie); 0 when there is none."""
    if not summaries:
        return 0
    return int(max(summaries, key=lambda s: (s["peak_bytes"], -s["rank"]))["rank"])


def rank_peaks_line(ranks: list[dict[str, Any]], shown: int, fmt: Any) -> str:
    """``rank 0 1.2 GiB (shown), rank 1 1.1 GiB``: every rank's peak for the human report."""
    return ", ".join(
        f"rank {r['rank']} {fmt(r['peak_bytes'])}" + (" (shown)" if r["rank"] == shown else "") for r in ranks
    )
