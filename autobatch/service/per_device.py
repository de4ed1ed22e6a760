"""The tune of each device the settings name: instant when nothing changed, one tuner per device, once
per GPU model.

:func:`tune_devices` picks the devices (one per distinct GPU model) and tunes each with :func:`tune_target`:
the stored result when nothing that decides memory changed, else a session and a tuner under the tune's
and the device's locks, every probe journaled, the complete result stored with what jobs that ran with the
tune's answer saw (runtime evidence). The stops, in order: docs/architecture.md.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from autobatch.cache import CacheFolder, EvidenceStore, ResultStore, tune_inputs
from autobatch.cache.evidence import summary
from autobatch.cache.results import served, unfingerprinted
from autobatch.run.session import Warnings
from autobatch.service.sessions import device_lock, open_session
from autobatch.settings.levers import lever

if TYPE_CHECKING:
    from autobatch.devices.inventory import Inventory
    from autobatch.devices.selection import Target
    from autobatch.records.result import TuneResult
    from autobatch.run.options import TuneRequest
    from autobatch.service.hooks import Hooks


def tune_devices(request: TuneRequest, hooks: Hooks, inventory: Inventory | None = None) -> TuneResult:
    """Tune every device the ``device`` setting names on this machine and return the one result."""
    from autobatch.devices.selection import resolve_targets

    device = request.settings.device
    targets = resolve_targets(device.device, device.memory, inventory)
    if len(targets) == 1:
        return tune_target(request, targets[0], hooks)
    from autobatch.run.across_models import merge_models

    results = []
    for number, target in enumerate(targets, 1):
        hooks.on_status(
            f"GPU model {number} of {len(targets)}: {target.model} on {target.label} "
            f"(visible as {', '.join(f'cuda:{i}' for i in target.indices)})"
        )
        results.append(tune_target(request, target, hooks))
    return merge_models(results, targets, request.options)


def tune_target(request: TuneRequest, target: Target, hooks: Hooks) -> TuneResult:
    """One device: the stored result, or a tune under the device's lock (see the module docstring)."""
    settings = request.settings
    warnings = Warnings(hooks.on_warning)  # the target's: shown once each, kept in its result's notes
    folder = CacheFolder(settings.probe.cache_dir, warn=warnings)
    store = ResultStore(folder) if settings.probe.cache else None
    world = request.options.world_size
    inputs = tune_inputs(settings, target.identity, world, spec=request.spec, why_not=target.not_cached)
    reuse = store is not None and not request.refresh
    hit = store.get(inputs, target.used_bytes) if store is not None and reuse else None
    if hit is not None:
        return _serve(hit, request, hooks, warnings, folder)
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
                    f"the tune {key}",
                    hooks,
                    warnings,
                    folder.path / "locks",
                    waits_for=f"the tune {key}, which another run is computing",
                )
            )
            hit = store.get(inputs, target.used_bytes)
            if hit is not None:
                return _serve(hit, request, hooks, warnings, folder)
        held.enter_context(device_lock(settings, target.lock_key, target.label, hooks, warnings))
        used = _used_now(target) if target.used_bytes is not None else None
        hit = store.get(inputs, used) if store is not None and reuse else None
        if hit is not None:  # the run we waited for stored it
            return _serve(hit, request, hooks, warnings, folder)
        result = _run(request, target, hooks, warnings)
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
            result.cache = {"key": inputs.key(), "served": False, "folder": str(folder.path)}
    if store is not None and inputs.cacheable:
        _evidence_note(folder, inputs.key(), result)
    return result


def _run(request: TuneRequest, target: Target, hooks: Hooks, warnings: Warnings) -> TuneResult:
    """Start a session on the target's device and run the tune (the caller holds the device's lock)."""
    from autobatch.run.tuner import Tuner

    session = open_session(
        request.settings,
        hooks,
        spec=request.spec,
        target=target,
        lock=False,
        warnings=warnings,
        refresh=request.refresh,
    )
    with session:
        info = session.device
        assert info is not None, "a session is started as it is entered"
        hooks.on_device(info)
        for warning in info.warnings:  # already among the device's notes, which the result's start with
            hooks.on_warning(warning)
        tuner = Tuner(session, request.options, on_update=hooks.on_update, on_status=hooks.on_status)
        hooks.on_start(tuner.result)
        return tuner.run()


def _serve(
    hit: Any, request: TuneRequest, hooks: Hooks, warnings: Warnings, folder: CacheFolder
) -> TuneResult:
    result = served(hit, request.spec.label, list(request.settings.script.script_args), str(folder.path))
    note = request.options.world_note  # this run's, where the run that measured stated its own
    if note and note not in result.notes:
        result.notes.append(note)
    warnings.keep_in(result.notes)
    hooks.on_status(
        f"served from the cache: nothing that decides memory changed since {hit.made} "
        f"(key {hit.key}; `autobatch cache show {hit.key}`; {lever(request.settings.door, 'refresh', True)} measures "
        "again)"
    )
    _evidence_note(folder, hit.key, result)
    return result


def _evidence_note(folder: CacheFolder, key: str, result: TuneResult) -> None:
    """What jobs run with this key's answer saw, in the result's notes (after it was stored: never kept)."""
    said = summary(EvidenceStore(folder).read(key))
    if said is not None:
        result.notes.append(said)


def _used_now(target: Target) -> int | None:
    """Memory in use on the target's GPU now (NVML), read again once the lock is held."""
    from autobatch.devices.inventory import read_inventory

    for gpu in read_inventory().visible():
        if target.device == f"cuda:{gpu.index}":
            return gpu.used_bytes
    return target.used_bytes
