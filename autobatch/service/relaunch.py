"""``autobatch run``: a script run as it is, launched with its plan, relaunched smaller when memory runs out.

1. The plan: ``--result FILE``, else the tune of the same script, arguments and settings (served from the
   cache when nothing that decides memory changed, else measured now: :func:`autobatch.service.tune.tune`).
   The evidence goes under the key that tune is stored under (:func:`tuned_key`).
2. The job's command line is the one the tune prints (:func:`autobatch.emit.args.command`: ``{batch}`` and
   ``{accum}`` filled in, the plan's environment, ``torchrun`` for several ranks), run by this Python.
3. Each launch (:func:`autobatch.supervise.job.launch`) ends as the job ends. A job that ran out of memory is
   relaunched at the next smaller micro-batch with the accumulation that keeps its global batch
   (:func:`smaller`), with the resume arguments added, up to ``max_restarts`` times; any other end is the job's,
   its exit code passed through, never retried; a job whose own guard gave up (its last error a ``GuardError``)
   ends ``run`` with the guard's error, since a relaunch would run the same batch through the same guard.
4. Every launch is recorded as runtime evidence (:class:`autobatch.cache.evidence.EvidenceStore`): how it ended,
   its micro-batch, its peak against the tuned one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from autobatch.cache import CacheFolder, Event, EvidenceStore, tune_inputs
from autobatch.core.plan import plan_accumulation
from autobatch.core.units import format_bytes
from autobatch.devices.budget import EarlyWarning
from autobatch.emit.args import command
from autobatch.errors import AutobatchError, GuardError, JobOutOfMemory, UsageError
from autobatch.records.result import Chosen, TuneResult
from autobatch.service.hooks import Hooks
from autobatch.service.tune import tune, tune_request
from autobatch.step.as_is import ACCUM_PLACEHOLDER, has_placeholder, variables
from autobatch.supervise.job import PEAK_HOW, JobOutcome, JobSpec, launch

if TYPE_CHECKING:
    from autobatch.settings import Settings

Say = Callable[[str], None]


@dataclass(frozen=True)
class RunOptions:
    """What ``run`` adds to a tune's settings: the plan's file (None: the cache, or a tune now), how many
    relaunches, the arguments that make the script resume (added from the second launch on)."""

    result_file: str | None = None
    max_restarts: int = 3
    resume_args: tuple[str, ...] = ()


def run(settings: Settings, options: RunOptions, hooks: Hooks, say: Say, warn: Say) -> int:
    """Launch the job with its plan, relaunch it smaller when it runs out of memory; the job's exit code."""
    script = settings.script
    if options.result_file is None and (has_placeholder(script.script_args) or script.batch_env):
        _check_relaunch(
            script.script_args, options
        )  # the command line's faults, refused before a tune of minutes
    result, key = plan_of(settings, options, hooks)
    chosen = _check(result, options)
    _not_in_a_worker(chosen, os.environ)
    store = EvidenceStore(CacheFolder(settings.probe.cache_dir, warn=warn)) if key is not None else None
    if key is None:
        warn(
            "no cache key for this plan (a result file of another tune, or --no-cache): launches are not recorded"
        )
    budget = result.device.get("budget_bytes")
    kind = str(result.device.get("type") or "cpu")
    cpu = kind == "cpu"
    cap = int(result.device["capacity_bytes"]) if cpu and settings.device.memory is not None else None
    micro, accumulation = chosen.micro_batch_size, chosen.accumulation_steps
    for number in range(1, options.max_restarts + 2):
        plan = replace(chosen, micro_batch_size=micro, accumulation_steps=accumulation)
        spec = job_spec(replace(result, chosen=plan), options.resume_args if number > 1 else (), cap, kind)
        outcome = launch(spec, budget, EarlyWarning("cpu", budget, warn).check if cpu and budget else None)
        tuned = result.tuned_peak(micro)
        if store is not None and key is not None:
            store.record(key, _event(plan, number, outcome, tuned, budget, kind))
        if outcome.peak_bytes and tuned:
            how = "" if cpu else " on its busiest device per NVML, CUDA contexts included"
            say(
                f"launch {number}: peak {format_bytes(outcome.peak_bytes)}{how} (tuned {format_bytes(tuned)}, budget "
                f"{format_bytes(budget or 0)}) at micro-batch {micro}"
            )
        if outcome.guard is not None:  # out of memory one sample at a time, or BatchNorm refused one sample
            raise GuardError(
                f"the job's guard gave up on launch {number} (autobatch.errors.GuardError: {outcome.guard.message}): "
                "a relaunch at a smaller micro-batch would run the same batch, which the guard already split down "
                "to one sample",
                hint=outcome.guard.hint
                or "shorten or bucket the batch's longest samples, or make each sample cheaper (bf16, "
                "recomputation); `autobatch tune` at its lengths says what fits",
            )
        if outcome.oom is None:
            return outcome.returncode
        if number > options.max_restarts:
            raise JobOutOfMemory(
                f"the job ran out of memory at micro-batch {micro} x accumulation {accumulation} on launch {number} "
                f"({outcome.oom}), and --max-restarts {options.max_restarts} relaunches are used up",
                hint="raise --max-restarts, lower the plan (tune with a smaller --memory or a larger --headroom), "
                "or make the job's worst batch the tune's (its first batches must be the worst case)",
            )
        nxt = smaller(plan)
        if nxt is None:
            raise JobOutOfMemory(
                f"the job ran out of memory at micro-batch 1 ({outcome.oom}): no smaller micro-batch is left",
                hint="one sample does not fit beside what the job holds: a smaller model, bf16, recomputation, "
                "or a larger device",
            )
        say(
            f"relaunch {number} of {options.max_restarts}: the job ran out of memory at micro-batch {micro} x "
            f"accumulation {accumulation} ({outcome.oom}); now micro-batch {nxt[0]} x accumulation {nxt[1]} x "
            f"world {plan.world_size} = global {plan.global_batch_size}"
            + (f", with {' '.join(options.resume_args)}" if options.resume_args else "")
        )
        micro, accumulation = nxt
    raise AssertionError("unreachable: the last launch returns or raises")


def plan_of(settings: Settings, options: RunOptions, hooks: Hooks) -> tuple[TuneResult, str | None]:
    """The plan (from the file, the cache or a tune now) and the key its evidence goes under."""
    if options.result_file is None:
        result = tune(settings, hooks, generated_by="autobatch run")  # a kept result names its key
    else:
        result = TuneResult.load(options.result_file)
        if settings.script.script is not None:
            script = str(Path(settings.script.script).resolve())
            result = replace(result, script=script, script_args=list(settings.script.script_args))
    stored = (result.cache or {}).get("key")
    if stored:
        return result, str(stored)
    return result, tuned_key(settings) if settings.probe.cache and settings.script.script else None


def tuned_key(settings: Settings) -> str | None:
    """The key a tune of these settings is stored under (None: several devices, or one not kept)."""
    from autobatch.devices.selection import resolve_targets

    try:
        request = tune_request(settings, None, False)
        targets = resolve_targets(request.settings.device.device, request.settings.device.memory)
    except AutobatchError:
        return None
    if len(targets) != 1:
        return None
    inputs = tune_inputs(
        request.settings, targets[0].identity, request.options.world_size, spec=request.spec,
        why_not=targets[0].not_cached,
    )  # fmt: skip
    return inputs.key() if inputs.cacheable else None


def _check(result: TuneResult, options: RunOptions) -> Chosen:
    chosen = result.chosen
    if result.as_is is None or chosen is None:
        raise UsageError(
            "run launches a script run as it is with its plan, and this "
            + ("result has no chosen plan" if chosen is None else "script defines autobatch's functions"),
            hint="run the training script itself: autobatch run train.py -- --batch-size {batch} --grad-accum "
            "{accum} (the placeholders are filled with the plan)",
        )
    if not has_placeholder(result.script_args) and not result.as_is.get("batch_env"):
        raise UsageError(
            "nothing in the script's arguments takes the plan's micro-batch",
            hint="put {batch} where the script takes its batch size: autobatch run train.py -- --batch-size {batch}",
        )
    _check_relaunch(result.script_args, options)
    return chosen


def _check_relaunch(script_args: Sequence[str], options: RunOptions) -> None:
    """A relaunch needs ``{accum}`` in the script's arguments to keep the global batch, and 0 or more of them."""
    if options.max_restarts < 0:
        raise UsageError(f"--max-restarts {options.max_restarts}", hint="give 0 or more relaunches")
    if options.max_restarts and not any(ACCUM_PLACEHOLDER in arg for arg in script_args):
        raise UsageError(
            "a relaunch keeps the global batch by accumulating gradients, and the script's arguments have no "
            "{accum} to carry the accumulation steps",
            hint="add {accum} where the script takes them (-- --batch-size {batch} --grad-accum {accum}), or "
            "--max-restarts 0 to launch once",
        )


#: What a launcher sets in each worker it starts (torchrun, accelerate, Lightning's and DeepSpeed's launchers).
WORKER_VARIABLES = ("RANK", "LOCAL_RANK")


def _not_in_a_worker(plan: Chosen, environ: Mapping[str, str]) -> None:
    """Refuse to start a plan's world of several processes from inside a launched worker: every worker of the
    launcher would start the whole world again (a plan for ``WORLD_SIZE=2``, run in each of torchrun's two
    ranks, four processes in two worlds)."""
    named = {name: environ[name] for name in WORKER_VARIABLES if name in environ}
    if plan.world_size > 1 and named:
        words = " ".join(f"{name}={value}" for name, value in named.items())
        raise UsageError(
            f"autobatch run is running inside a worker of a launched job ({words}), and the plan's command starts "
            f"its own world of {plan.world_size} processes: each worker would start the whole world again",
            hint="run `autobatch run` once, outside the launcher (it starts the ranks itself); or run the script "
            f"in each worker with the plan's micro-batch {plan.micro_batch_size} and accumulation "
            f"{plan.accumulation_steps}",
        )


def smaller(plan: Chosen) -> tuple[int, int] | None:
    """The next smaller micro-batch and the accumulation that keeps the plan's global batch (None at 1).

    The global batch is the plan's own (micro-batch x accumulation x world), so a micro-batch of 1 always
    keeps it exactly; the largest micro-batch below the current one that keeps it exactly is taken (the
    fewest accumulation steps). A script that accumulates on its own keeps its own factor: the rest is split."""
    if plan.micro_batch_size <= 1:
        return None
    own = plan.script_accumulation or 1
    given = plan.accumulation_steps // own
    per_step = plan.micro_batch_size * given * plan.world_size
    new = plan_accumulation(plan.micro_batch_size - 1, per_step, plan.world_size)
    return new.micro_batch_size, new.accumulation_steps * own


def job_spec(result: TuneResult, resume: tuple[str, ...], cap: int | None, device: str = "cpu") -> JobSpec:
    """The job's command line as the tune prints it, run by this Python, with the resume arguments after it."""
    words = command(result, sys.executable)  # run by this Python, whichever the tune measured with
    assert words is not None and result.chosen is not None
    env = dict(os.environ)
    while words[0] != sys.executable:  # NAME=value words, up to the interpreter (a path may hold a =)
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    env.update(
        variables(result.chosen.micro_batch_size, None, result.chosen.seq_len)
    )  # autobatch's own, as in a probe
    return JobSpec(
        [*words, *resume], env, None, cap, device
    )  # this Python (with torchrun's module), the script


def _event(
    plan: Chosen, number: int, outcome: JobOutcome, tuned: int | None, budget: int | None, device: str
) -> Event:
    reason = outcome.oom or ""
    extra: dict[str, object] = {"seconds": round(outcome.seconds, 1)}
    if outcome.guard is not None:  # its own guard gave up: its error, whether or not memory caused it
        how, reason = "guard", f"GuardError: {outcome.guard.message}"
        extra.update({"hint": outcome.guard.hint} if outcome.guard.hint else {})
        extra.update({"oom": outcome.oom} if outcome.oom else {})
    elif outcome.oom is not None:
        how = "oom"
    elif outcome.forwarded is not None or outcome.returncode > 128:
        how = "signal"
    else:
        how = "exit"
    return Event(
        source="run",
        kind="launch",
        micro_batch_size=plan.micro_batch_size,
        accumulation_steps=plan.accumulation_steps,
        world_size=plan.world_size,
        outcome=how,
        exit_code=outcome.returncode,
        launch=number,
        peak_bytes=outcome.peak_bytes,
        peak_how=PEAK_HOW.get(device) if outcome.peak_bytes else None,
        tuned_peak_bytes=tuned,
        budget_bytes=budget,
        reason=reason,
        extra=extra,
    )
