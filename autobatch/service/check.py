"""``check`` behind every face: one batch size (or several, in order) on one device, under the device's lock.

It opens its session through :func:`autobatch.service.sessions.open_session` (the same device, budget and
lock as a tune), tells the face the device (:attr:`Hooks.on_device`), and refuses a precision the device
cannot run before the probe; :mod:`autobatch.service.explain` does the same through :func:`combination`
and :func:`started`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from autobatch.core.levels import PARTIAL, parse_level
from autobatch.core.space import Combo
from autobatch.errors import UsageError
from autobatch.service.hooks import Hooks, worded
from autobatch.service.sessions import open_session, script_strategy
from autobatch.settings.levers import in_words, lever

if TYPE_CHECKING:
    from autobatch.records.check import CheckResult
    from autobatch.run.session import Session
    from autobatch.settings import Settings
    from autobatch.settings.values import Door
    from autobatch.step.spec import ScriptSpec


def combination(settings: Settings, recompute: bool | str, compile: bool = False) -> Combo:
    """The one combination ``check`` and ``explain`` run: the first precision and optimizer of the settings, at
    the one sequence length given (none: make_batch's one shape)."""
    lengths, door = settings.search.seq_lens, settings.door
    if len(lengths) > 1:
        raise UsageError(
            f"{lever(door, 'seq_lens')} was given {len(lengths)} times ({', '.join(map(str, lengths))}); this command "
            "runs one length",
            hint=f"give one {lever(door, 'seq_lens')} (tune searches several)",
        )
    seq_len = lengths[0] if lengths else None
    try:
        level = parse_level(recompute)
    except ValueError as exc:
        raise UsageError(
            f"{lever(door, 'recompute')} {exc}", hint="give off, full, selective or K/N"
        ) from None
    if level == PARTIAL:
        raise UsageError(
            f"{lever(door, 'recompute', 'partial')}: partial is chosen by a tune",
            hint="give K/N, such as 6/12",
        )
    precision, optimizer = settings.search.precisions[0], settings.search.optimizers[0]
    return Combo(precision, optimizer, level, seq_len, compile)


def check(
    settings: Settings,
    batch_size: int,
    hooks: Hooks | None = None,
    *,
    recompute: bool | str = False,
    compile: bool = False,
    steps: int | None = None,
    spec: ScriptSpec | None = None,
) -> CheckResult:
    """One isolated probe of ``steps`` steps (default: ``confirm_steps``) at ``batch_size``; running out of
    memory is an answer (``fits`` false), the script's error, a crash or a timeout raise."""
    (report,) = checks(
        settings, (batch_size,), hooks, recompute=recompute, compile=compile, steps=steps, spec=spec
    )
    return report


def checks(
    settings: Settings,
    batch_sizes: Sequence[int],
    hooks: Hooks | None = None,
    *,
    recompute: bool | str = False,
    compile: bool = False,
    steps: int | None = None,
    spec: ScriptSpec | None = None,
) -> Iterator[CheckResult]:
    """:func:`check` at each of ``batch_sizes`` in the order given, in one session (one device lock, one probe
    server, one inspection of the model): each result as its probe ends. Each probe is forked from the same
    server as a tune's are, so asking for the answer and the next batch at once measures what two commands
    would, for one start."""
    from autobatch.core.space import SCRIPT_COMBO
    from autobatch.run.check import check_batch

    door = settings.door
    hooks = (hooks or Hooks()).worded(door)
    with worded(door):
        counts(door, batch_size=batch_sizes, steps=[steps] if steps is not None else [])
        combo = combination(settings, recompute, compile)
        settings = script_strategy(settings, spec)
        session = open_session(settings, hooks, spec=spec)
        session.use_cache = (
            False  # a check always probes (no journal); the job's fresh process may be the one kept
        )
        with session:
            if session.as_is:  # its precision, optimizer and recomputation are the script's own
                combo = SCRIPT_COMBO.at(combo.seq_len)
            started(session, combo, hooks)
            for batch_size in batch_sizes:
                report = check_batch(session, combo, batch_size, steps or settings.probe.confirm_steps)
                report.reason = report.reason and in_words(report.reason, door)
                yield report


def counts(door: Door, **given: Sequence[object]) -> None:
    """Refuse a batch size or a number of steps that is not a whole number of at least 1 before anything starts
    (the command's flags hold theirs to it; a probe of batch 0 reads a NaN loss as the step's fault)."""
    for name, values in given.items():
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(
                    f"{lever(door, name, value)}: expected a whole number of at least 1",
                    hint=f"give {name.replace('_', ' ')} as an int, such as {lever(door, name, 8)}",
                )


def started(session: Session, combo: Combo, hooks: Hooks) -> None:
    """Tell the face the started session's device, and refuse a precision the device cannot run."""
    info = session.device
    assert info is not None, "open_session() starts the session"
    hooks.on_device(info)
    unsupported = info.unsupported(combo.precision)
    if unsupported:
        raise UsageError(unsupported, hint=f"pick another {lever(session.settings.door, 'precision')}")
