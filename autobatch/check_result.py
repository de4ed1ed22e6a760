"""The answer of one check (``autobatch check --json``, ``autobatch.check()``): does this batch fit?"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core.space import Combo
    from .devices.budget import DeviceInfo
    from .probe.protocol import ProbeOutcome
    from .session import Session


@dataclass
class CheckResult:
    """One isolated probe at one batch size; :meth:`to_dict` is ``check --json``.

    ``within_margin``: it fitted the cap, but closer to it than ``tune`` accepts (a fresh process can
    exceed the budget there; see :mod:`autobatch.devices.budget`).
    """

    fits: bool
    kind: str
    batch_size: int
    precision: str
    optimizer: str
    recompute: bool
    steps: int
    peak_bytes: int | None
    step_peaks: list[int]
    budget_bytes: int
    capacity_bytes: int
    device: str
    step_seconds: list[float]
    samples_per_second: float | None
    static_bytes: dict[str, int]
    reason: str | None
    within_margin: bool
    device_stats: dict[str, Any] = field(default_factory=dict)
    #: Distributed probes: the strategy, world size and fixed cost; every rank's peak (``peak_bytes`` is the
    #: largest); the rank whose failure ended the probe.
    strategy: dict[str, Any] | None = None
    rank_peak_bytes: list[int] = field(default_factory=list)
    failed_rank: int | None = None
    #: The probe's wall clock, fork to answer: less the steps' seconds, its fixed cost.
    wall_seconds: float = 0.0

    @classmethod
    def from_outcome(cls, combo: Combo, outcome: ProbeOutcome, info: DeviceInfo) -> CheckResult:
        fits = outcome.fits
        return cls(
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
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def check_batch(session: Session, combo: Combo, batch_size: int, steps: int) -> CheckResult:
    """One probe of ``steps`` steps at ``batch_size`` on a started session (``check``'s whole job).

    The script's own error raises (exit 3), as does a crash or a timeout (exit 6); an out-of-memory
    is an answer (``fits`` false).
    """
    from .errors import UsageError
    from .probe.failures import raise_for

    info = session.device
    assert info is not None, "start() the session first"
    unsupported = info.unsupported(combo.precision)
    if unsupported:
        raise UsageError(unsupported, hint="pick another --precision")
    outcome = session.probe(combo, batch_size, min_steps=steps, max_steps=steps, strict=False)
    raise_for(outcome, what=f"{combo.key} at batch {batch_size}")
    return CheckResult.from_outcome(combo, outcome, info)
