"""The tune of each device the settings name: instant when nothing changed, one tuner per device, once
per GPU model.

:func:`tune_devices` reads the machine (:mod:`autobatch.devices.inventory`, no torch), picks the devices
to tune (:func:`autobatch.devices.selection.targets_for`: the one named, or one per distinct GPU
model), and tunes each with :func:`tune_target`:

1. the tune's inputs and key (:mod:`autobatch.cache.keys`); a stored result for them is served at
   once, without a probe server, unless ``refresh`` (``tune --refresh``) or the device is busier now;
2. otherwise two locks are taken (:meth:`autobatch.run.locks.RunLock.device`), waiting for another run if
   need be, and the store is asked again after each (the run waited for may have just stored the
   answer): first the tune's key, in the cache folder (identical tunes on other devices of the model,
   on other nodes sharing the cache, in a job array, compute once), then the device's (no two runs
   probe one device at once; two identical tunes started together probe once, same result);
3. a session (:func:`autobatch.service.sessions.open_session`) and a :class:`~autobatch.run.tuner.Tuner`
   run the tune, every
   probe journaled (so a tune killed halfway resumes without measuring anything twice);
4. a complete result is stored.

Several GPU models give several results, merged into one plan by :func:`autobatch.run.mixed.merge_models`.
Everything the caller shows comes through :class:`~autobatch.service.hooks.Hooks`; nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autobatch.cache import CacheFolder, ResultStore, tune_inputs
from autobatch.cache.results import served, unfingerprinted
from autobatch.service.sessions import device_lock, open_session

if TYPE_CHECKING:
    from autobatch.devices.inventory import Inventory
    from autobatch.devices.selection import Target
    from autobatch.records.result import TuneResult
    from autobatch.service.hooks import Hooks
    from autobatch.settings import Settings
    from autobatch.step.spec import ScriptSpec


def tune_devices(
    settings: Settings,
    world: int,
    world_source: str,
    hooks: Hooks,
    *,
    spec: ScriptSpec | None = None,
    refresh: bool = False,
    inventory: Inventory | None = None,
) -> TuneResult:
    """Tune every device the ``device`` setting names on this machine and return the one result."""
    from autobatch.devices.selection import resolve_targets

    targets = resolve_targets(settings.device.device, settings.device.memory, inventory)
    if len(targets) == 1:
        return tune_target(settings, targets[0], world, world_source, hooks, spec=spec, refresh=refresh)
    from autobatch.run.mixed import merge_models

    results = []
    for number, target in enumerate(targets, 1):
        hooks.on_status(
            f"GPU model {number} of {len(targets)}: {target.model} on {target.label} "
            f"(visible as {', '.join(f'cuda:{i}' for i in target.indices)})"
        )
        results.append(tune_target(settings, target, world, world_source, hooks, spec=spec, refresh=refresh))
    return merge_models(results, targets, settings, world, world_source)


def tune_target(
    settings: Settings,
    target: Target,
    world: int,
    world_source: str,
    hooks: Hooks,
    *,
    spec: ScriptSpec | None = None,
    refresh: bool = False,
) -> TuneResult:
    """One device: the stored result, or a tune under the device's lock (see the module docstring)."""
    warnings: list[str] = []
    hooks = replace(hooks, on_warning=_collecting(warnings, hooks.on_warning))
    folder = CacheFolder(settings.probe.cache_dir, warn=hooks.on_warning)
    store = ResultStore(folder) if settings.probe.cache else None
    inputs = tune_inputs(settings, target.identity, world, spec=spec, why_not=target.not_cached)
    reuse = store is not None and not refresh
    hit = store.get(inputs, target.used_bytes) if store is not None and reuse else None
    if hit is not None:
        return _serve(hit, settings, spec, hooks, warnings)
    if store is not None and store.changed:
        hooks.on_status(
            f"measuring again: {', '.join(store.changed)} changed since the cache's result for this tune was made "
            "(the script reads it)"
        )
    with ExitStack() as held:
        if store is not None and reuse and inputs.cacheable and folder.writable:
            # Identical tunes on other devices of this model (other nodes sharing the cache, a job
            # array) wait for the first and are served its result.
            key = inputs.key()
            held.enter_context(
                device_lock(
                    settings,
                    f"computing-{key}",
                    f"the tune {key}, which another run is computing",
                    hooks,
                    folder.path / "locks",
                )
            )
            hit = store.get(inputs, target.used_bytes)
            if hit is not None:
                return _serve(hit, settings, spec, hooks, warnings)
        held.enter_context(device_lock(settings, target.lock_key, target.label, hooks))
        used = _used_now(target) if target.used_bytes is not None else None
        hit = store.get(inputs, used) if store is not None and reuse else None
        if hit is not None:  # the run we waited for stored it
            return _serve(hit, settings, spec, hooks, warnings)
        result = _run(settings, target, world, world_source, hooks, spec=spec, refresh=refresh)
        _add_warnings(result, warnings)
        if store is not None and not inputs.cacheable:
            result.notes.append(f"result not kept in the cache: {inputs.why_not}")
        elif store is not None and (unknown := unfingerprinted(result)):
            result.notes.append(
                f"result not kept in the cache: the script reads {', '.join(unknown)}, which could not be "
                "fingerprinted (gone after the probe, not a regular file, or unreadable), so a stored answer could "
                "not tell when it changes"
            )
        elif store is not None and store.put(inputs, result, used):
            result.notes.append(f"result kept in the cache as {inputs.key()}")
    return result


def _run(
    settings: Settings,
    target: Target,
    world: int,
    world_source: str,
    hooks: Hooks,
    *,
    spec: ScriptSpec | None,
    refresh: bool,
) -> TuneResult:
    """Start a session on the target's device and run the tune (the caller holds the device's lock)."""
    from autobatch.run.tuner import TuneOptions, Tuner

    session = open_session(settings, hooks, spec=spec, target=target, lock=False, refresh=refresh)
    try:
        info = session.start()
        hooks.on_device(info)
        for warning in info.warnings:
            hooks.on_warning(warning)
        options = TuneOptions.from_settings(settings, world, world_source)
        tuner = Tuner(session, options, on_update=hooks.on_update, on_status=hooks.on_status)
        hooks.on_start(tuner.result)
        return tuner.run()
    finally:
        session.close()


def _collecting(into: list[str], show: Callable[[str], None]) -> Callable[[str], None]:
    def warn(message: str) -> None:
        if message not in into:
            into.append(message)
            show(message)

    return warn


def _add_warnings(result: TuneResult, warnings: list[str]) -> None:
    """Every warning of the run in the result's notes (once: the device's are there already)."""
    for warning in warnings:
        note = f"warning: {warning}"
        if note not in result.notes:
            result.notes.append(note)


def _serve(
    hit: Any, settings: Settings, spec: ScriptSpec | None, hooks: Hooks, warnings: list[str]
) -> TuneResult:
    from autobatch.step.spec import spec_from_settings

    label = (spec or spec_from_settings(settings)).label
    result = served(hit, label, list(settings.script.script_args))
    _add_warnings(result, warnings)
    hooks.on_status(
        f"served from the cache: nothing that decides memory changed since {hit.made} "
        f"(key {hit.key}; `autobatch cache show {hit.key}`; --refresh measures again)"
    )
    return result


def _used_now(target: Target) -> int | None:
    """Memory in use on the target's GPU now (NVML), read again once the lock is held."""
    from autobatch.devices.inventory import read_inventory

    for gpu in read_inventory().visible():
        if target.device == f"cuda:{gpu.index}":
            return gpu.used_bytes
    return target.used_bytes
