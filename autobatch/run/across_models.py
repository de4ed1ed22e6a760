"""A job that spans several GPU models: one plan from one tune per model.

Each distinct model on the node is tuned once (:func:`autobatch.run.calibrate.calibrate`). In a
data-parallel job every rank runs the same micro-batch, so the job can use no more than the smallest
maximum, and it steps at the pace of its slowest GPU. :func:`merge_models` therefore takes, per
combination, the smallest maximum over the models (and that model's peak and trace) and the lowest
measured throughput, then plans accumulation and chooses as a single-device tune does
(:mod:`autobatch.core.plan`). A combination that is not feasible on one model is not feasible for
the job. The throughput compared is each model's at its own maximum: an approximation, said in the
notes. ``devices`` lists each model's own maxima, budget and whether it came from the cache.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from autobatch.core.plan import Candidate, choose, plan_accumulation
from autobatch.core.units import format_bytes
from autobatch.errors import NothingFitsError
from autobatch.records.result import Chosen, ComboResult, TuneResult

if TYPE_CHECKING:
    from autobatch.devices.selection import Target
    from autobatch.run.options import TuneOptions


def merge_models(results: list[TuneResult], targets: list[Target], options: TuneOptions) -> TuneResult:
    """One result for a job spanning every model (see the module docstring)."""
    first = results[0]
    merged = TuneResult(
        script=first.script,
        script_args=list(first.script_args),
        device=dict(first.device),
        objective=first.objective,
        combinations=[],
        status="complete" if all(r.status == "complete" for r in results) else "failed",
        probes=sum(r.probes for r in results),
        wall_seconds=round(sum(r.wall_seconds or 0.0 for r in results), 3),
        torch_version=first.torch_version,
        autobatch_version=first.autobatch_version,
        created=first.created,
        notes=[],
    )
    merged.devices = [_model_entry(r, t) for r, t in zip(results, targets, strict=False)]
    binding: dict[int, int] = {}
    for index, combos in enumerate(zip(*(r.combinations for r in results), strict=False)):
        entry, which = _merge_combo(list(combos), targets)
        merged.combinations.append(entry)
        binding[index] = which
    _plan_and_choose(merged, options)
    if merged.chosen is not None:
        chosen_index = next(
            i for i, c in enumerate(merged.combinations) if c.max_batch_size and _same(c, merged.chosen)
        )
        merged.device = dict(results[binding[chosen_index]].device)
    merged.notes.append(
        f"one job spans {len(targets)} GPU models ({'; '.join(t.model for t in targets)}): each combination's "
        "maximum is the smallest over the models, its throughput the slowest model's (at that model's maximum)"
    )
    if options.world_note:
        merged.notes.append(options.world_note)
    for result, target in zip(results, targets, strict=False):
        merged.notes.extend(f"{target.model}: {note}" for note in result.notes)
    if merged.chosen is None:
        raise NothingFitsError(
            "no combination fits even the smallest batch on every GPU model of this job",
            hint="see each model's maxima (`devices` in the result); try bf16, a lighter optimizer or recomputation",
        )
    return merged


def _merge_combo(combos: list[ComboResult], targets: list[Target]) -> tuple[ComboResult, int]:
    """The job's view of one combination across models, and the index of the model that binds it."""
    infeasible = [i for i, c in enumerate(combos) if not c.answered]
    if infeasible:
        which = infeasible[0]
        entry = copy.deepcopy(combos[which])
        if not entry.answered:
            entry.max_batch_size = None
        entry.reason = f"{targets[which].model}: {entry.reason or entry.status}"
    else:
        which = min(range(len(combos)), key=lambda i: (combos[i].max_batch_size or 0, i))
        entry = copy.deepcopy(combos[which])
        speeds = [c.samples_per_second for c in combos if c.samples_per_second]
        entry.samples_per_second = min(speeds) if speeds else None
        if len({c.max_batch_size for c in combos}) > 1:
            each = ", ".join(f"{t.model} {c.max_batch_size}" for t, c in zip(targets, combos, strict=False))
            entry.reason = f"smallest maximum across the GPU models ({each})"
    entry.probes = sum(c.probes for c in combos)
    return entry, which


def _plan_and_choose(merged: TuneResult, options: TuneOptions) -> None:
    candidates: list[Candidate] = []
    plans = {}
    for index, entry in enumerate(merged.combinations):
        if not entry.answered or entry.max_batch_size is None:
            candidates.append(Candidate(index, None, None, None))
            continue
        plan = plan_accumulation(
            entry.max_batch_size, options.global_batch_size, options.world_size, options.limits.batch_multiple
        )
        plans[index] = plan
        candidates.append(Candidate(index, entry.max_batch_size, entry.samples_per_second, plan))
    winner = choose(candidates, merged.objective)
    if winner is None:
        return
    entry, plan = merged.combinations[winner], plans[winner]
    merged.chosen = Chosen.of(entry, plan)


def _model_entry(result: TuneResult, target: Target) -> dict[str, Any]:
    return {
        "model": target.model,
        "device": target.device,
        "indices": list(target.indices),
        "budget_bytes": result.device.get("budget_bytes"),
        "budget": format_bytes(result.device.get("budget_bytes") or 0),
        "served_from_cache": bool((result.cache or {}).get("served")),
        "probes": result.probes,
        "max_batch_sizes": {c.key: c.max_batch_size for c in result.combinations},
    }


def _same(entry: ComboResult, chosen: Chosen) -> bool:
    return entry.ident == chosen.ident
