"""``autobatch explain``: measure one batch size, break its peak down, predict (and verify) the levers.

The report (``explain --json``) holds the categories, which add up to the measured peak with the residual, the
per-module table, the levers and the measured line; a batch that does not fit the budget is measured again
under a larger cap so that the breakdown still explains the whole step. What it shows:
docs/explain-estimate.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from autobatch.core.levels import FULL, OFF
from autobatch.core.maximum import Limits
from autobatch.core.search import Affine
from autobatch.core.space import Combo, block_labels
from autobatch.core.units import format_bytes
from autobatch.explain.parent.driver import explain_probe, measure, measure_max
from autobatch.explain.parent.on_ranks import (
    add_strategy_lever,
    distributed_section,
    estimate_fields,
    residual_note,
)
from autobatch.explain.pure.attention_lever import attention_lever, attention_section
from autobatch.explain.pure.levers import Lever, apply_predictions, plan_levers, ranked
from autobatch.explain.pure.options import ESTIMATE, Calibration, EstimateOptions, NamedScenario, Points
from autobatch.records.failures import raise_for
from autobatch.records.protocol import ProbeOutcome
from autobatch.run.session import Session


@dataclass
class ExplainReport:
    script: str
    device: dict[str, Any]
    precision: str
    optimizer: str
    recompute: bool
    batch_size: int
    fits: bool
    kind: str
    peak_bytes: int
    budget_bytes: int
    categories: dict[str, int]
    residual_bytes: int
    modules: list[dict[str, Any]] = field(default_factory=list)
    levers: list[dict[str, Any]] = field(default_factory=list)
    measured: list[dict[str, Any]] = field(default_factory=list)
    line: dict[str, float] | None = None
    peak_phase: str = ""
    flops: int = 0
    macs: int = 0
    outside_budget: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    distributed: dict[str, Any] | None = None  # --strategy: autobatch.explain.parent.on_ranks
    seq_len: int | None = None  # --seq-len: tokens per sample
    attention_scores: dict[str, Any] | None = None  # --seq-len: autobatch.explain.pure.attention_lever

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("distributed", "seq_len", "attention_scores"):
            if data[name] is None:
                del data[name]
        return data


Progress = Callable[[str], None]

_CLASH = (
    "the model has a width of {seq_len}, the sequence length: its (batch, {seq_len}, width) activations may be "
    "counted as attention scores; explain at another --seq-len to tell them apart"
)


def explain_batch(
    session: Session,
    combo: Combo,
    batch_size: int,
    limits: Limits,
    *,
    vocab_trim: float,
    verify: bool = False,
    progress: Progress | None = None,
) -> ExplainReport:
    """Run the whole explanation on a started session (see the module docstring)."""
    device = session.device
    assert device is not None
    say = progress or (lambda _text: None)
    report, points = _measure(session, combo, batch_size, limits, say)
    if not points:
        report.notes.append("no measured batch completed: levers not predicted")
        return report
    levers = plan_levers(
        combo,
        unsupported=device.unsupported_precisions,
        recompute_blocks=block_labels(device.recompute_blocks, device.recompute_counts),  # "Block x 12"
        blocks=sum(device.recompute_counts.values()),
        has_embedding=any(m.get("type") == "Embedding" for m in report.modules),
        vocab_trim=vocab_trim,
    )
    say("predicting the levers (fake-tensor simulations calibrated on the measured step)")
    _predict(session, combo, levers, points, batch_size, limits)
    add_strategy_lever(levers, report.distributed, report, limits)
    budget_limits = (report.budget_bytes, limits.max_batch_size, limits.batch_multiple)
    lever = attention_lever(report.attention_scores, levers[0], report.line, batch_size, budget_limits)
    if lever is not None:
        levers.append(lever)
    levers = ranked(levers)
    if verify:
        _verify(session, levers, limits, say, combo.seq_len)
    report.levers = [lever.to_dict() for lever in levers]
    return report


def _measure(
    session: Session, combo: Combo, batch_size: int, limits: Limits, say: Progress
) -> tuple[ExplainReport, list[tuple[int, int]]]:
    """The instrumented runs: the batch size (again under a larger cap when it does not fit, so that the
    breakdown explains the whole step) and half of it for the slope; the report and the measured points."""
    device = session.device
    assert device is not None
    steps = (limits.steps, limits.max_steps)
    notes: list[str] = []
    say(f"measuring {combo.key} at batch {batch_size}")
    verdict = explained = explain_probe(session, combo, batch_size, budget_bytes=None, steps=steps)
    cap: int | None = None
    if not verdict.fits:
        cap = _larger_cap(session)
        notes.append(
            f"batch {batch_size} does not fit the budget of {format_bytes(device.budget_bytes)} ({verdict.kind}); "
            f"measured again under a cap of {format_bytes(cap)} to explain the whole step"
        )
        say(
            f"batch {batch_size} does not fit ({verdict.kind}); measuring it under a cap of {format_bytes(cap)}"
        )
        again = explain_probe(session, combo, batch_size, budget_bytes=cap, steps=steps)
        if again.fits or not explained.info.get("categories"):
            explained = again
    other = batch_size // 2 if batch_size >= 2 else 2
    say(f"measuring batch {other} for the per-sample slope")
    second = explain_probe(session, combo, other, budget_bytes=cap, steps=steps)
    measured: list[dict[str, Any]] = [
        {"batch_size": batch_size, "peak_bytes": explained.peak_bytes, "kind": explained.kind},
        {"batch_size": other, "peak_bytes": second.peak_bytes, "kind": second.kind},
    ]
    report = _report(session, combo, batch_size, verdict, explained, measured, notes)
    return report, _points(measured)


def _report(
    session: Session,
    combo: Combo,
    batch_size: int,
    verdict: ProbeOutcome,
    explained: ProbeOutcome,
    measured: list[dict[str, Any]],
    notes: list[str],
) -> ExplainReport:
    """The report: the verdict of the run under the budget, the breakdown of the run that explains the
    step (the same run, unless it did not fit and was measured again under a larger cap)."""
    device = session.device
    assert device is not None
    info = explained.info
    line = _line(_points(measured))
    modules = list(info.get("modules", []))
    section = distributed_section(session, explained)
    if section is not None:
        notes = [*notes, residual_note(section)]
    peak = int(explained.peak_bytes or 0)
    attention = attention_section(info.get("attention_scores"), dict(info.get("categories", {})), peak)
    if attention is not None and attention["width_clash"]:
        notes = [*notes, _CLASH.format(seq_len=combo.seq_len)]
    return ExplainReport(
        script=str(session.script),
        device=device.to_dict(),
        precision=combo.precision,
        optimizer=combo.optimizer,
        recompute=combo.recompute,
        batch_size=batch_size,
        fits=verdict.fits,
        kind=verdict.kind,
        peak_bytes=peak,
        budget_bytes=device.budget_bytes,
        categories=dict(info.get("categories", {})),
        residual_bytes=int(info.get("residual_bytes", 0)),
        modules=modules,
        measured=measured,
        line={"static_bytes": line.intercept, "bytes_per_sample": line.slope} if line else None,
        peak_phase=str(info.get("peak_phase", "")),
        flops=sum(int(m.get("flops", 0)) for m in modules),
        macs=sum(int(m.get("macs", 0)) for m in modules),
        outside_budget=dict(info.get("outside_budget", {})),
        notes=notes + list(info.get("notes", [])),
        distributed=section,
        seq_len=combo.seq_len,
        attention_scores=attention,
    )


def _points(measured: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(batch size, peak) of the measured runs that fit."""
    return [
        (int(m["batch_size"]), int(m["peak_bytes"]))
        for m in measured
        if m["kind"] == "fits" and m["peak_bytes"]
    ]


def _predict(
    session: Session,
    combo: Combo,
    levers: list[Lever],
    points: list[tuple[int, int]],
    batch_size: int,
    limits: Limits,
) -> None:
    device = session.device
    assert device is not None
    now = levers[0].scenario
    assert now is not None
    scenarios = [
        NamedScenario(
            lever.name,
            lever.scenario,
            _own_points(session, combo, lever, batch_size, limits) if lever.kind == "precision" else (),
        )
        for lever in levers
        if lever.applicable and lever.scenario is not None
    ]
    options = EstimateOptions(
        budget_bytes=device.budget_bytes,
        scenarios=tuple(scenarios),
        target="cpu" if device.type == "cpu" else "cuda",
        max_batch_size=limits.max_batch_size,
        batch_multiple=limits.batch_multiple,
        optimizer_kwargs={k: dict(v) for k, v in session.settings.search.optimizer_kwargs.items()},
        calibrate=Calibration(now, tuple(points)),
        report_at=(batch_size,),
        **estimate_fields(session),
    )
    request = session.request(
        combo,
        batch_size,
        steps=(limits.steps, limits.max_steps),
        op=ESTIMATE,
        options=options.to_dict(),
        budget_bytes=0,
        timeout=session.settings.probe.timeout * max(1, len(scenarios)),
    )
    outcome = session.run(request, what="predicting the levers")
    raise_for(outcome, what="predicting the levers")
    info = outcome.info
    apply_predictions(levers, {s["name"]: s for s in info.get("scenarios", [])}, batch_size)


def _own_points(session: Session, now: Combo, lever: Lever, batch_size: int, limits: Limits) -> Points:
    """A lever that changes the kernels (precision: oneDNN's bf16 GEMMs instead of MKL's fp32 ones) changes
    the buffers libraries keep outside PyTorch's allocator: measure its step at the explained batch size
    once, so that its prediction is calibrated on its own kernels."""
    assert lever.scenario is not None
    scenario = lever.scenario
    combo = Combo(scenario.precision, scenario.optimizer, FULL if scenario.recompute else OFF).at(now.seq_len)
    outcome = measure(session, combo, batch_size, scenario.transforms, (limits.steps, limits.max_steps))
    return ((batch_size, int(outcome.peak_bytes)),) if outcome.fits and outcome.peak_bytes else ()


def _verify(
    session: Session, levers: list[Lever], limits: Limits, say: Progress, seq_len: int | None
) -> None:
    from autobatch.errors import ScriptError

    now = levers[0]
    for lever in levers:
        if not lever.applicable or lever.scenario is None:
            continue
        scenario = lever.scenario
        combo = Combo(scenario.precision, scenario.optimizer, FULL if scenario.recompute else OFF).at(seq_len)
        prior = (
            Affine(lever.static_bytes, lever.bytes_per_sample)
            if lever.static_bytes is not None and lever.bytes_per_sample
            else None
        )
        say(f"verifying {lever.name}: searching its maximum with real probes")
        try:
            found = measure_max(session, combo, scenario.transforms, limits, prior=prior)
        except ScriptError as exc:
            lever.applicable, lever.reason = False, f"the real step failed: {exc.message}"
            continue
        lever.verified_max_batch_size, lever.verify_probes = found.max_batch_size, found.probes
    for lever in levers:
        if lever.kind == "accumulation" and lever.applicable and now.verified_max_batch_size:
            lever.verified_max_batch_size = (lever.accumulation_steps or 1) * now.verified_max_batch_size


def _line(points: list[tuple[int, int]]) -> Affine | None:
    if len(points) < 2 or points[0][0] == points[1][0]:
        return None
    (b1, p1), (b2, p2) = sorted(points)
    slope = (p2 - p1) / (b2 - b1)
    return Affine(p2 - slope * b2, slope)


def _larger_cap(session: Session) -> int:
    device = session.device
    assert device is not None
    if device.type == "cuda":
        return device.capacity_bytes
    import psutil

    return max(device.budget_bytes * 2, int(psutil.virtual_memory().available * 0.8))
