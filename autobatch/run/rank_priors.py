"""Reuse across strategies: a strategy tune's first probe from the same tune's single-process probes.

A tune with ``--strategy ddp|fsdp`` reads the probe journal that a tune of the same script, arguments,
device and budget without a strategy keeps (:attr:`autobatch.run.session.Session.single_fingerprint`: the
journal's key without the strategy), fits each combination's single-process line from its probes and
moves it to one rank (:mod:`autobatch.core.rank_prior`: FSDP divides parameters, gradients and
optimizer state by N, DDP adds gradient buckets; the slope carries over). Static memory comes from what
the single-process probes measured, else from the model's inspection (parameter shapes, each block's
parameters) and the optimizer's analytic state.

The prior only proposes where to probe: the search still brackets and confirms, so a journal that
misleads costs probes, never correctness.
"""

from __future__ import annotations

from autobatch.cache import CacheFolder, ProbeJournal
from autobatch.cache.journal import Combination
from autobatch.core.maximum import StaticMemory
from autobatch.core.model import Affine
from autobatch.core.rank_prior import GLOO_RANK_BYTES, RankState, curve_of, strategy_prior
from autobatch.core.reuse import Prediction
from autobatch.core.space import Combo
from autobatch.records.protocol import ProbeOutcome
from autobatch.records.readings import measured_static, observation
from autobatch.run.session import Session


class StrategyPriors:
    """The single-process probes of one tune's script, read once, and the per-rank priors they give."""

    def __init__(self, session: Session, outcomes: list[tuple[Combination, ProbeOutcome]]) -> None:
        self.session = session
        self.outcomes = outcomes

    @classmethod
    def of(cls, session: Session) -> StrategyPriors | None:
        """The priors of a started session with a strategy and a cache; None when there is nothing to read."""
        if (
            session.settings.distributed.strategy == "none"
            or not session.use_cache
            or not session.single_fingerprint
        ):
            return None
        folder = CacheFolder(session.settings.probe.cache_dir, warn=session.warn)
        outcomes = ProbeJournal.open(folder, session.single_fingerprint).outcomes()
        return cls(session, outcomes) if outcomes else None

    def single_process(self, combo: Combo) -> list[ProbeOutcome]:
        key = (*combo.ident, combo.seq_len)
        return [o for k, o in self.outcomes if k == key]

    def predict(self, combo: Combo) -> Prediction | None:
        """One rank's line for ``combo`` (None when the single-process probes give no line for it)."""
        device = self.session.device
        assert device is not None
        outcomes = self.single_process(combo)
        shapes = [tuple(s) for s in device.param_shapes]
        analytic = StaticMemory.analytic(combo.precision, combo.optimizer, shapes, device.param_count)
        single = curve_of(observation(o, state_bytes=analytic.optimizer_state) for o in outcomes)
        static = measured_static(outcomes) or analytic
        elem = static.parameters / device.param_count if device.param_count else 0.0
        blocks = device.block_params
        state = RankState(
            static.parameters,
            static.gradients,
            static.optimizer_state,
            largest_block=int(max(blocks, default=0) * elem),
            unblocked=int(max(device.param_count - sum(blocks), 0) * elem),  # no blocks: the root holds all
        )
        runtime = GLOO_RANK_BYTES if device.type == "cpu" else 0
        return strategy_prior(
            single, self.session.settings.distributed.strategy, self.session.ranks, state, runtime
        )

    def describe(self, combo: Combo, prior: Prediction, budget_bytes: int) -> str:
        """The progress line and note of a prior: where it puts the first probe and where it came from."""
        where = Affine(prior.intercept, prior.slope).predict_max(budget_bytes)
        first = f"first probe near batch {int(where)}" if where is not None and where >= 1 else "first probe"
        return (
            f"{combo.key}: {first}: {prior.basis} ({len(self.single_process(combo))} single-process probes)"
        )
