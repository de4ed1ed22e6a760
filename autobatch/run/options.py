"""What one tune searches and plans (:class:`TuneOptions`), built from the settings (where every default lives),
and the tune as the front door resolved it (:class:`TuneRequest`), passed whole down to each device's tuner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autobatch.core.maximum import Limits
from autobatch.records.result import Circumstance
from autobatch.run.lengths import plan_lengths
from autobatch.settings.levers import lever

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
    #: Where the plan's world size came from (:func:`world_note`): a circumstance of the run (its flags, its
    #: environment), so a result served from the cache states the serving run's instead.
    world_note: Circumstance | None = None

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
            world_note=world_note(settings, world_size, world_size_source),
        )


def world_note(settings: Settings, world_size: int, source: str) -> Circumstance | None:
    """The note on where the plan's world size came from, when it tells something: a world of several processes
    (from a flag, a keyword, a variable, a file, a launcher, a strategy or the Trainer); a world of 1 that nothing
    gave only when a global batch is planned over it (the job may run more processes than the tune was told of).
    A world of 1 that something gave is what it says, and the plan shows it."""
    from autobatch.settings import DEFAULT_WORLD

    if world_size > 1:
        return Circumstance(f"world size {world_size} from {source}")
    if source != DEFAULT_WORLD or settings.plan.global_batch_size is None:
        return None
    return Circumstance(
        f"world size 1: nothing gave one (no {lever(settings.door, 'world_size')}, WORLD_SIZE or SLURM variables), "
        f"so the global batch of {settings.plan.global_batch_size} is planned for one process"
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
