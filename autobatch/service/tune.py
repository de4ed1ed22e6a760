"""``tune`` behind every face: the command, :func:`autobatch.tune`, the Lightning callback and the
calibration step of a cluster job run this one function, so they obey the same rules.

The tune is resolved once (:func:`tune_request`), the result file checked and held before any probe and
rewritten after each, every device tuned (:mod:`autobatch.service.per_device`), the answer shown before the
last write, then the launcher configs written. A failed or interrupted tune keeps what it measured.
The whole walk: docs/architecture.md; the result file's life: docs/result-file.md.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from autobatch.emit import refuse_fallback, targets
from autobatch.errors import AutobatchError, NoBlocksError, NothingFitsError, UsageError
from autobatch.records.files import preflight
from autobatch.run.locks import RunLock
from autobatch.run.options import TuneOptions, TuneRequest
from autobatch.service.hooks import Hooks, worded
from autobatch.service.per_device import tune_devices
from autobatch.service.saving import FIX, ResultSaver, started_result
from autobatch.service.sessions import script_strategy
from autobatch.settings import planned_world
from autobatch.settings.levers import lever

if TYPE_CHECKING:
    from collections.abc import Callable

    from autobatch.devices.budget import DeviceInfo
    from autobatch.records.result import TuneResult
    from autobatch.settings import Settings
    from autobatch.step.spec import ScriptSpec


def tune(
    settings: Settings,
    hooks: Hooks | None = None,
    *,
    spec: ScriptSpec | None = None,
    result_file: str | Path | None = None,
    refresh: bool = False,
    generated_by: str = "autobatch",
) -> TuneResult:
    """Every combination's exact maximum, the chosen configuration and its plan (see the module docstring).

    ``spec`` replaces the settings' script (callables or an object handed to the API); ``result_file``
    is written after every probe (None: no file); ``refresh`` measures again instead of serving the
    cache; ``generated_by`` heads the emitted files.
    """
    hooks = (hooks or Hooks()).worded(settings.door)
    with worded(settings.door):
        return _tune(tune_request(settings, spec, refresh), hooks, result_file, generated_by)


def _tune(
    request: TuneRequest, hooks: Hooks, result_file: str | Path | None, generated_by: str
) -> TuneResult:
    settings = request.settings
    saver = ResultSaver(Path(result_file), hooks.on_warning) if result_file is not None else None
    if saver is not None:
        preflight(saver.path, "result file", FIX)
    targets(settings.output.emit)  # the launcher configs' paths, checked as the result file's
    held = (
        RunLock.result_file(saver.path, timeout=settings.probe.lock_timeout, on_wait=hooks.on_wait,
                            on_warning=hooks.on_warning)
        if saver is not None else nullcontext()
    )  # fmt: skip
    with held:  # one run per result file, for the whole run: it writes the file and the configs
        result = _measure(request, hooks, saver)
        hooks.on_result(result)
        if saver is not None:
            saver.finish(result)
            hooks.on_status(f"result written to {saver.path}")
        if settings.output.emit:
            emit_from_settings(result, settings, generated_by, hooks.on_status)
    return result


def tune_request(settings: Settings, spec: ScriptSpec | None, refresh: bool) -> TuneRequest:
    """The tune resolved once, before any probe: the settings it measures (:func:`script_strategy`), its step,
    and its options with the world the plan is for (:func:`planned_world`), the global batch checked against it."""
    from autobatch.step.spec import spec_from_settings

    settings = script_strategy(settings, spec)
    world, world_source = planned_world(settings, os.environ)
    check_world_split(settings, world, world_source)
    check_global_batch(settings, world, world_source)
    options = TuneOptions.from_settings(settings, world, world_source)
    spec = spec or spec_from_settings(settings)
    spec.check()  # a missing script is bad input: refused before the result file is marked or a lock waited for
    return TuneRequest(settings, spec, options, refresh)


def _measure(request: TuneRequest, hooks: Hooks, saver: ResultSaver | None) -> TuneResult:
    """The tune's result, the result file marked from the start and rewritten after every probe; a tune
    that stops early marks what it has (``failed``, ``interrupted``), writes it, shows it and re-raises."""
    settings, spec = request.settings, request.spec
    latest: list[TuneResult] = []
    if saver is not None:  # from now on the file is this run's, never an earlier run's answer
        latest.append(started_result(settings, spec.target if spec.is_file else spec.label))
        saver(latest[0])

    def keep(result: TuneResult) -> None:
        latest[:1] = [result]
        hooks.on_start(result)

    def update(result: TuneResult) -> None:
        latest[:1] = [result.in_words(settings.door)]
        if saver is not None:
            saver(result)
        hooks.on_update(result)

    def device(info: DeviceInfo) -> None:
        if info.fell_back:
            refuse_fallback(settings.output.emit, settings.output.allow_cpu, settings.door)
        hooks.on_device(info)

    inner = replace(hooks, on_start=keep, on_update=update, on_device=device)
    try:
        result = tune_devices(request, inner)
        if (result.cache or {}).get("served") and (
            result.device.get("requested"),
            result.device.get("type"),
        ) == ("auto", "cpu"):
            refuse_fallback(
                settings.output.emit, settings.output.allow_cpu, settings.door
            )  # as a tune run now would have
    except BaseException as exc:
        if latest:
            _keep_partial(latest[0], exc, saver, hooks, settings)
        raise
    result.in_words(settings.door)
    if saver is not None:
        saver(result)
    return result


def check_global_batch(settings: Settings, world: int, world_source: str) -> None:
    """Every process needs at least one micro-batch (of ``batch_multiple`` samples) of the global batch."""
    global_batch, multiple = settings.plan.global_batch_size, settings.search.batch_multiple
    if global_batch is not None and global_batch < world * multiple:
        raise UsageError(
            f"global_batch_size {global_batch} is smaller than the world size {world} (from {world_source}) x "
            f"batch multiple {multiple}: every process needs at least {multiple} sample(s) per step",
            hint=f"raise {lever(settings.door, 'global_batch_size')} to a multiple of {world * multiple}, or lower "
            f"{lever(settings.door, 'world_size')}",
        )


def check_world_split(settings: Settings, world: int, world_source: str) -> None:
    """A strategy's world is nodes of ``nproc_per_node`` ranks each, every node as measured: a world that is not
    a multiple of it has no such split (its command would start another number of processes than it plans for)."""
    dist = settings.distributed
    if dist.strategy == "none" or world % dist.nproc_per_node == 0:
        return
    per_node = dist.nproc_per_node
    lower, upper = world // per_node * per_node, (world // per_node + 1) * per_node
    worlds = " or ".join(lever(settings.door, "world_size", n) for n in (lower, upper) if n >= per_node)
    raise UsageError(
        f"world size {world} (from {world_source}) is not a multiple of nproc_per_node {per_node}: "
        f"{world} / {per_node} = {world / per_node:.2f} nodes of the {per_node} ranks the probes measure",
        hint=f"plan for whole nodes ({worlds}), or measure the ranks of one node of the job (an "
        f"{lever(settings.door, 'nproc_per_node')} that divides {world})",
    )


def _keep_partial(
    result: TuneResult, exc: BaseException, saver: ResultSaver | None, hooks: Hooks, settings: Settings
) -> None:
    """What a tune that stopped early measured: marked, written, shown (in the door's words), and carried by the
    exception as its ``result`` (a notebook interrupted or failed with no result file keeps it there); a
    nothing-fits answer is complete, as is one whose every combination recomputes a model without repeated blocks
    (nothing to probe: the tune's answer, not a failure). The files of ``emit`` are not written: said so."""
    door = settings.door
    try:
        exc.result = result  # type: ignore[attr-defined]
    except AttributeError:  # an exception whose class refuses new attributes (__slots__)
        pass
    if not isinstance(exc, (NothingFitsError, NoBlocksError)):
        result.status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        if isinstance(exc, AutobatchError):
            result.notes.append(f"failed: {exc.message}")
        elif isinstance(exc, Exception):
            result.notes.append(f"failed: internal error: {type(exc).__name__}: {exc}")
    result.in_words(door)
    if saver is None:
        where = "not written (no result file)"
    else:
        saver(result)
        where = "not saved (see the warning above)" if saver.error else f"saved to {saver.path}"
    hooks.on_partial(result, where)
    if settings.output.emit:
        files = ", ".join(f"{path} ({fmt})" for fmt, path in targets(settings.output.emit))
        why = {
            "complete": "the tune chose nothing",
            "interrupted": "the tune was interrupted before it chose",
        }
        hooks.on_warning(f"not written: {files}: {why.get(result.status, 'the tune failed before it chose')}")


def emit_from_settings(
    result: TuneResult, settings: Settings, generated_by: str, say: Callable[[str], None]
) -> None:
    """Write the launcher configs the ``emit`` setting names, and say what was written and its caveats."""
    from autobatch.emit import emit, make_options, parse_emit_spec, report

    specs = [parse_emit_spec(spec) for spec in settings.output.emit]
    options = make_options(
        generated_by=generated_by,
        lightning_batch_key=settings.output.lightning_batch_key,
        deepspeed_base=settings.output.deepspeed_base,
        deepspeed_optimizer=settings.output.deepspeed_optimizer,
        allow_cpu=settings.output.allow_cpu,
    )
    written = emit(result, specs, options)
    for line in report(
        result, [(fmt, path) for (fmt, _), path in zip(specs, written, strict=False)], options
    ):
        say(line)
