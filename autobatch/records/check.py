"""The answer of one check (``autobatch check --json``, ``autobatch.check()``): does this batch fit?"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from autobatch.core.space import Combo
from autobatch.core.units import format_bytes
from autobatch.records.result import REPR_REASON


@dataclass(repr=False)
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
    #: Tokens per sample the probe's make_batch was asked for (None: its one shape)
    seq_len: int | None = None
    recompute_level: str | None = None  # off, full, selective or K/N (autobatch.core.levels)
    compile: bool = False
    compile_seconds: float | None = None

    @property
    def combo(self) -> Combo:
        """The combination the probe ran."""
        level = self.recompute_level or ("full" if self.recompute else "off")
        return Combo(self.precision, self.optimizer, level, self.seq_len, self.compile)

    def __repr__(self) -> str:
        """Its answer in a line, as ``check`` prints it (a notebook showed the whole dataclass: every step's peak, the
        device's stats, pages of it): the combination and batch, the verdict, the peak against the budget, the step
        time; the fields are all there."""
        length = f" at {self.seq_len} tokens" if self.seq_len else ""
        verdict = "fits" if self.fits else {"oom": "out of memory"}.get(self.kind, self.kind)
        said = [f"{verdict} after {self.steps} step" + ("" if self.steps == 1 else "s")]
        if self.peak_bytes:
            ranks = f" (the worst of {len(self.rank_peak_bytes)} ranks)" if self.rank_peak_bytes else ""
            said.append(
                f"peak {format_bytes(self.peak_bytes)} of budget {format_bytes(self.budget_bytes)}{ranks}"
            )
        if self.step_seconds:
            said.append(f"{sum(self.step_seconds) / len(self.step_seconds):.3f} s/step")
        if self.within_margin:
            said.append("within the margin tune keeps")
        if self.reason and not self.fits:
            line = self.reason.strip().splitlines()[0]
            said.append(line if len(line) <= REPR_REASON else line[: REPR_REASON - 3] + "...")
        return f"<CheckResult {self.combo.key} batch {self.batch_size}{length} on {self.device}: {', '.join(said)}>"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)
