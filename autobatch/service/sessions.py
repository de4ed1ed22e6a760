"""The one place a probe session is made from settings, for ``tune``, ``check`` and ``explain`` alike.

A session probes one device through a probe server (or the fake runner a test names in the hooks) and,
while open, holds that device's lock (:meth:`autobatch.run.locks.RunLock.device`): one tuner per device,
whichever face started it. A tune takes the lock itself, before it asks the result cache again
(:mod:`autobatch.service.per_device`), and passes ``lock=False``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from autobatch.errors import UsageError
from autobatch.run.locks import RunLock
from autobatch.run.session import Session, SessionWiring, Warnings

if TYPE_CHECKING:
    from collections.abc import Callable

    from autobatch.devices.selection import Target
    from autobatch.service.hooks import Hooks
    from autobatch.settings import Settings
    from autobatch.step.spec import ScriptSpec


def device_lock(
    settings: Settings,
    key: str,
    label: str,
    hooks: Hooks,
    warn: Callable[[str], None],
    folder: str | Path | None = None,
    waits_for: str | None = None,
) -> RunLock:
    """A lock named ``key`` (a device's, or a tune's in the cache folder), waiting as the settings say;
    ``warn`` is told when it cannot be taken (the run's :class:`~autobatch.run.session.Warnings`); ``label`` and
    ``waits_for``: what the messages call it (:meth:`RunLock.device`)."""
    return RunLock.device(
        key,
        label,
        folder=settings.probe.lock_dir if folder is None else folder,
        waits_for=waits_for,
        timeout=settings.probe.lock_timeout,
        on_wait=hooks.on_wait,
        on_warning=warn,
    )


def open_session(
    settings: Settings,
    hooks: Hooks,
    *,
    spec: ScriptSpec | None = None,
    target: Target | None = None,
    lock: bool = True,
    warnings: Warnings | None = None,
    refresh: bool = False,
    op_modules: tuple[str, ...] = (),
) -> Session:
    """A session on ``target`` (default: the first device the ``device`` setting names), unstarted, wired to
    ``hooks`` (the one place a face's hooks become a :class:`SessionWiring`).

    ``spec`` replaces the settings' script (callables or an object from the API); ``warnings`` are the run's
    (default: the session's own, shown through ``hooks.on_warning``); ``refresh`` and ``op_modules`` are
    :class:`Session`'s.
    """
    if target is None:
        from autobatch.devices.selection import resolve_targets

        target = resolve_targets(settings.device.device, settings.device.memory)[0]
    warnings = warnings if warnings is not None else Warnings(hooks.on_warning)
    wiring = SessionWiring(
        runner=hooks.runner_factory() if hooks.runner_factory is not None else None,
        on_probe=hooks.on_probe,
        warnings=warnings,
        wrap_runner=hooks.wrap_runner,
        lock=device_lock(settings, target.lock_key, target.label, hooks, warnings) if lock else None,
    )
    return Session(settings, spec=spec, target=target, wiring=wiring, refresh=refresh, op_modules=op_modules)


def _length_way(settings: Settings, spec: ScriptSpec) -> None:
    """Refuse lengths that cannot reach a script run as it is (every length would run the same shape), and a
    ``seq_len_env`` that no length would set."""
    from autobatch.settings.levers import lever
    from autobatch.step.as_is import SEQ_LEN_ENV, takes_length

    door, script = settings.door, settings.script
    lengths = settings.search.seq_lens or settings.plan.seq_len
    if spec.kind == "as_is" and lengths and not takes_length(script.script_args, script.seq_len_env):
        raise UsageError(
            f"sequence lengths were asked for ({lever(door, 'seq_lens')}), and nothing passes them to the script, "
            "which runs as it is: no {seq_len} in its arguments, no "
            f"{lever(door, 'seq_len_env')}; every length would run the same shape",
            hint="put {seq_len} where the script takes its length (`autobatch tune train.py --seq-len 512 -- "
            "--batch-size {batch} --max-len {seq_len}`), or name the environment variable it reads its length "
            f"from: {lever(door, 'seq_len_env', 'SEQ_LEN')} ({SEQ_LEN_ENV} is always set to each probe's length)",
        )
    if script.seq_len_env and spec.kind != "as_is":
        raise UsageError(
            f"{lever(door, 'seq_len_env')} names how a length reaches a script run as it is, and this one is not "
            "(it defines autobatch's functions, or is a model)",
            hint=f"drop {lever(door, 'seq_len_env')}: make_batch(batch_size, seq_len) takes each probe's length",
        )
    if script.seq_len_env and not lengths:
        raise UsageError(
            f"{lever(door, 'seq_len_env', script.seq_len_env)} names how a tuned length reaches the script, and no "
            "length is tuned",
            hint=f"tune the job's lengths ({lever(door, 'seq_lens', [512, 2048])}), or drop "
            f"{lever(door, 'seq_len_env')}",
        )


def script_strategy(settings: Settings, spec: ScriptSpec | None) -> Settings:
    """The settings a run measures: a script run as it is on ``nproc_per_node`` ranks joins its process
    group itself, so the strategy is its own; without ``--strategy`` the plan names it ``ddp`` (say
    ``--strategy fsdp`` for a script that shards), and its world is the ranks' (:func:`planned_world`)."""
    from dataclasses import replace

    from autobatch.step.spec import spec_from_settings

    dist, spec = settings.distributed, spec or spec_from_settings(settings)
    _length_way(settings, spec)
    if dist.strategy != "none" or dist.nproc_per_node < 2 or spec.kind != "as_is":
        return settings
    return replace(settings, distributed=replace(dist, strategy="ddp"))
