"""What one tune searches and plans (:class:`TuneOptions`), built from the settings (where every default lives),
and the tune as the front door resolved it (:class:`TuneRequest`), passed whole down to each device's tuner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autobatch.core.maximum import Limits
from autobatch.records.result import Circumstance
from autobatch.run.lengths import plan_lengths

if TYPE_CHECKING:
    from autobatch.settings import Settings
    from autobatch.step.spec import ScriptSpec


@dataclass(frozen=True)
class TuneOptions:
    """What one tune searches and plans (built from the settings, where every default lives)."""

    precisions: tuple[str, ...]
    optimizers: tuple[str, ...]
    recompute: tuple[str, ...]  # levels (autobatch.core.levels)
    limits: Limits
    global_batch_size: int | None
    world_size: int
    world_size_source: str
    objective: str
    exact_all: bool
    strict: bool = False  # a peak that depends on the data ends the tune (else a warning)
    compile: tuple[bool, ...] = (False,)
    seq_lens: tuple[int, ...] = ()  # lengths searched, ascending (the plan's among them); empty: one shape
    plan_seq_len: int | None = None

    @property
    def world_note(self) -> Circumstance | None:
        """The note on where the plan's world size came from: a circumstance of the run (its flags, its
        environment), so a result served from the cache states the serving run's instead."""
        if self.world_size_source == "default":
            return None
        return Circumstance(f"world size {self.world_size} from {self.world_size_source}")

    @classmethod
    def from_settings(cls, settings: Settings, world_size: int, world_size_source: str) -> TuneOptions:
        search, plan = settings.search, settings.plan
        seq_lens, plan_seq_len = plan_lengths(search.seq_lens, plan.seq_len)
        return cls(
            precisions=search.precisions,
            optimizers=search.optimizers,
            recompute=search.recompute,
            compile=search.compile,
            limits=settings.limits(),
            global_batch_size=plan.global_batch_size,
            world_size=world_size,
            world_size_source=world_size_source,
            objective=plan.objective,
            exact_all=search.exact_all,
            strict=search.strict,
            seq_lens=seq_lens,
            plan_seq_len=plan_seq_len,
        )


@dataclass(frozen=True)
class TuneRequest:
    """One tune, resolved once at the front door (:func:`autobatch.service.tune.tune`) and passed whole to every
    device's tune: the settings it measures, its step, what it searches and plans (the world the plan is for,
    and where that came from, among it), and whether it measures again instead of serving the cache."""

    settings: Settings
    spec: ScriptSpec  # the step: the settings' script, or callables or an object handed to the API
    options: TuneOptions
    refresh: bool = False
