"""``check``'s whole job on a started session: one probe at one batch size, as a :class:`CheckResult`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autobatch.records.check import CheckResult

if TYPE_CHECKING:
    from autobatch.core.space import Combo
    from autobatch.devices.budget import DeviceInfo
    from autobatch.records.protocol import ProbeOutcome
    from autobatch.run.session import Session


def check_batch(session: Session, combo: Combo, batch_size: int, steps: int) -> CheckResult:
    """One probe of ``steps`` steps at ``batch_size`` on a started session (``check``'s whole job).

    The script's own error raises (exit 3), as does a crash or a timeout (exit 6); an out-of-memory
    is an answer (``fits`` false).
    """
    from autobatch.records.failures import raise_for

    info = session.device
    assert info is not None, "start() the session first"
    outcome = session.probe(combo, batch_size, min_steps=steps, max_steps=steps, strict=False)
    raise_for(outcome, what=f"{combo.key} at batch {batch_size}")
    return check_result(combo, outcome, info)


def check_result(combo: Combo, outcome: ProbeOutcome, info: DeviceInfo) -> CheckResult:
    """The record of one probe at one batch size, against the device's budget."""
    fits = outcome.fits
    return CheckResult(
        fits=fits,
        kind=outcome.kind,
        batch_size=outcome.batch_size,
        precision=combo.precision,
        optimizer=combo.optimizer,
        recompute=combo.recompute,
        steps=outcome.steps,
        peak_bytes=outcome.peak_bytes,
        step_peaks=list(outcome.step_peaks),
        budget_bytes=info.budget_bytes,
        capacity_bytes=info.capacity_bytes,
        device=info.name,
        step_seconds=list(outcome.step_seconds),
        samples_per_second=outcome.samples_per_second,
        static_bytes={
            "parameters": outcome.param_bytes,
            "gradients": outcome.grad_bytes,
            "optimizer_state": outcome.optimizer_state_bytes,
        },
        reason=outcome.reason or (outcome.error_message if not fits else None),
        within_margin=fits and info.too_close(outcome.peak_bytes),
        device_stats=dict(outcome.device_stats),
        strategy=outcome.info.get("distributed"),
        rank_peak_bytes=list(outcome.rank_peak_bytes),
        failed_rank=outcome.failed_rank,
        wall_seconds=outcome.wall_seconds,
        seq_len=combo.seq_len,
        recompute_level=combo.recompute_level,
        compile=combo.compile,
        compile_seconds=outcome.compile_seconds,
    )
