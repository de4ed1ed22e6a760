"""The Python API: ``autobatch.tune()`` and ``autobatch.check()`` from your own code or a notebook.

They run the CLI's isolated probes (a probe server; every probe a fresh process) and return the objects
``--json`` documents: a :class:`~autobatch.records.result.TuneResult` and a
:class:`~autobatch.records.check.CheckResult`. The step, the settings keywords, the output and the errors
are described in docs/python-api.md.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autobatch.core.space import Combo
    from autobatch.devices.budget import DeviceInfo
    from autobatch.records.check import CheckResult
    from autobatch.records.protocol import ProbeOutcome, ProbeRunner
    from autobatch.records.result import TuneResult
    from autobatch.service.hooks import Hooks
    from autobatch.settings import Settings
    from autobatch.settings.levers import Door
    from autobatch.step.spec import ScriptSpec

logger = logging.getLogger("autobatch")
FUNCTIONS = ("build_model", "make_batch", "compute_loss")


@dataclass(frozen=True)
class ProbeEvent:
    """One probe, as it finished (or as the probe cache replayed it: ``cached``)."""

    precision: str
    optimizer: str
    recompute: bool
    batch_size: int
    kind: str  # fits | oom | timeout | crash
    peak_bytes: int | None
    samples_per_second: float | None
    seconds: float
    cached: bool
    reason: str | None

    @property
    def combination(self) -> str:
        return f"{self.precision}/{self.optimizer}/{'recompute' if self.recompute else 'no-recompute'}"

    def __str__(self) -> str:
        from autobatch.core.units import format_bytes

        text = f"{self.combination} batch {self.batch_size}: {self.kind}"
        if self.peak_bytes:
            text += f", peak {format_bytes(self.peak_bytes)}"
        if self.reason and self.kind != "fits":
            text += f" ({self.reason})"
        return text + (" (cached)" if self.cached else f", {self.seconds:.1f} s")


def tune(
    script: Any = None,
    *,
    build_model: Callable[[], Any] | None = None,
    make_batch: Callable[..., Any] | None = None,
    compute_loss: Callable[[Any, Any], Any] | None = None,
    config: str | Path | None = None,
    on_probe: Callable[[ProbeEvent], None] | None = None,
    runner: ProbeRunner | None = None,
    refresh: bool = False,
    **settings: Any,
) -> TuneResult:
    """Every combination's exact maximum, the chosen configuration and its accumulation plan.

    See the module docstring for the step, the settings (keyword arguments named as in
    ``autobatch.toml``) and where progress goes; ``refresh`` measures again instead of serving the
    result cache. Raises what ``autobatch tune`` exits with.
    """
    loaded = _settings("tune", config, script, settings)
    return _tune(loaded, script, (build_model, make_batch, compute_loss), on_probe, runner, refresh)


def callback_tune(
    script: Any,
    implied: Mapping[str, tuple[Any, str]],
    *,
    config: str | Path | None = None,
    on_probe: Callable[[ProbeEvent], None] | None = None,
    runner: ProbeRunner | None = None,
    refresh: bool = False,
    **settings: Any,
) -> TuneResult:
    """:func:`tune` for the Lightning callback: ``settings`` are the keywords its user gave ``AutoBatch``, and
    ``implied`` what the fit runs, each value with where it came from (the Trainer's device, precision and world
    size, the training data's size), which the user's keywords replace. Its messages name keywords, and a
    value implied by the fit as the fit's, not as a keyword its user never wrote."""
    given = dict(settings)
    loaded = _settings(
        "AutoBatch", config, script, {**{name: value for name, (value, _) in implied.items()}, **given},
        door="callback", labels={name: by for name, (_, by) in implied.items() if name not in given},
    )  # fmt: skip
    return _tune(loaded, script, (None, None, None), on_probe, runner, refresh)


def _tune(
    loaded: Settings,
    script: Any,
    functions: tuple[Any, ...],
    on_probe: Callable[[ProbeEvent], None] | None,
    runner: ProbeRunner | None,
    refresh: bool,
) -> TuneResult:
    from autobatch.service.tune import tune as run_tune

    result_file = loaded.output.result if loaded.origin("result") != "default" else None
    with _spec(script, loaded, functions) as spec:
        return run_tune(
            loaded,
            _hooks(on_probe, runner, on_result=_log_chosen),
            spec=spec,
            result_file=result_file,
            refresh=refresh,
            generated_by="autobatch.tune()",
        )


#: The keywords of :func:`check` that shape its one probe rather than name a setting (``recompute``,
#: ``compile`` and ``steps`` are settings of a tune's search too: here they mean the checked probe's own).
CHECK_KEYWORDS = ("precision", "optimizer", "recompute", "compile", "steps")


def check(
    script: Any = None,
    *,
    batch_size: int,
    build_model: Callable[[], Any] | None = None,
    make_batch: Callable[..., Any] | None = None,
    compute_loss: Callable[[Any, Any], Any] | None = None,
    config: str | Path | None = None,
    on_probe: Callable[[ProbeEvent], None] | None = None,
    runner: ProbeRunner | None = None,
    **settings: Any,
) -> CheckResult:
    """One isolated probe of ``steps`` steps (default: the ``confirm_steps`` setting) at ``batch_size``.

    The probe's shape is given by keywords taken out of ``settings`` before the rest are read as settings
    (:data:`CHECK_KEYWORDS`): ``precision`` and ``optimizer`` (default: the first of the ``precisions`` and
    ``optimizers`` settings); ``recompute``, a bool (off or full) or a level (``"selective"``, ``"6/12"``);
    ``compile``, True to run the model under ``torch.compile``; ``steps``, the probe's steps. Running out of
    memory is an answer (``fits`` false), not an error. The step and the settings are given as to
    :func:`tune`; the device's lock is held as for a tune.
    """
    from autobatch.service.check import check as run_check
    from autobatch.settings.levers import given_by

    shape = {name: settings.pop(name) for name in CHECK_KEYWORDS if name in settings}
    labels = {}  # a problem with the one precision or optimizer names the keyword its caller wrote
    for one, setting in (("precision", "precisions"), ("optimizer", "optimizers")):
        if shape.get(one) is not None:
            settings[setting] = [shape[one]]
            labels[setting] = given_by("api", one, shape[one])
    loaded = _settings("check", config, script, settings, labels=labels)
    with _spec(script, loaded, (build_model, make_batch, compute_loss)) as spec:
        return run_check(
            loaded,
            batch_size,
            _hooks(on_probe, runner),
            recompute=shape.get("recompute", False),
            compile=shape.get("compile", False),
            steps=shape.get("steps"),
            spec=spec,
        )


# -- settings and the step ----------------------------------------------------------------------------


def _settings(
    what: str,
    config: str | Path | None,
    script: Any,
    given: dict[str, Any],
    door: Door = "api",
    labels: Mapping[str, str] | None = None,
) -> Settings:
    """Keyword arguments as settings (unknown names are a TypeError, as Python reports them), their messages in
    ``door``'s words; ``labels``: where the ones the caller's user did not write as that setting came from (the
    Trainer, check's ``precision=``)."""
    import difflib

    from autobatch.settings import load_settings
    from autobatch.settings.docs import BY_NAME

    for name in given:
        if name not in BY_NAME:
            near = difflib.get_close_matches(name, list(BY_NAME), n=1)
            raise TypeError(
                f"{what}() got an unexpected keyword argument {name!r}"
                + (f"; did you mean {near[0]!r}?" if near else "; settings are named as in autobatch.toml")
            )
    overrides = dict(given)
    if isinstance(script, (str, os.PathLike)):
        overrides["script"] = os.fspath(script)
    return load_settings(config=config, overrides=overrides, use_default_file=False, door=door, labels=labels)


@contextmanager
def _spec(script: Any, settings: Settings, functions: tuple[Any, ...]) -> Iterator[ScriptSpec]:
    """Where the step comes from; an object or callables are pickled into a file that lives for the block."""
    from autobatch.step.spec import spec_from_settings

    given = {name: fn for name, fn in zip(FUNCTIONS, functions, strict=False) if fn is not None}
    if given and script is not None:
        raise TypeError("pass either a script (or object) or build_model/make_batch/compute_loss, not both")
    if given:
        missing = [name for name in FUNCTIONS[:2] if name not in given]
        if missing:
            raise TypeError(
                f"the step needs {' and '.join(missing)} too (compute_loss is optional for transformers)"
            )
        label = f"<callables from {getattr(given['build_model'], '__module__', '?')}>"
        found: Any = types.SimpleNamespace(**given)
    elif script is None or isinstance(script, (str, os.PathLike)):
        yield spec_from_settings(settings)
        return
    elif isinstance(script, types.ModuleType) and script.__name__ != "__main__":
        from autobatch.step.spec import ScriptSpec

        yield ScriptSpec("reference", script.__name__, sys_path=_sys_path(), label=script.__name__)
        return
    else:
        found, label = _object(script)
    with tempfile.TemporaryDirectory(prefix="autobatch-step-") as folder:
        yield _pickled(found, Path(folder) / "step.pkl", label)


def _object(script: Any) -> tuple[Any, str]:
    """An object holding the step (``__main__`` as a namespace of its functions) and its label."""
    if isinstance(script, types.ModuleType):  # __main__: by value, never re-run as a module
        names = [*FUNCTIONS, "RECOMPUTE_CLASSES"]
        return types.SimpleNamespace(
            **{n: getattr(script, n) for n in names if hasattr(script, n)}
        ), "<__main__>"
    if not all(callable(getattr(script, name, None)) for name in FUNCTIONS[:2]):
        raise TypeError(
            f"{type(script).__name__} is not a training step: expected a script path, 'package.module:attribute', "
            "a module, or an object with build_model, make_batch and compute_loss"
        )
    return script, f"<{type(script).__name__} from {type(script).__module__}>"


def _pickled(found: Any, path: Path, label: str) -> ScriptSpec:
    import cloudpickle

    from autobatch.errors import UsageError
    from autobatch.step.identity import step_identity
    from autobatch.step.spec import ScriptSpec

    try:
        payload = cloudpickle.dumps(found)
    except Exception as exc:  # noqa: BLE001 - what cloudpickle cannot carry (locks, open files, ...)
        raise UsageError(
            f"cannot send {label} to the probe server: {type(exc).__name__}: {exc}",
            hint="the step's functions must be picklable with cloudpickle: keep open files, locks and "
            "processes out of what they reference, or put them in an importable module",
        ) from None
    path.write_bytes(payload)
    return ScriptSpec(
        "pickled", str(path), {"identity": step_identity(found)}, sys_path=_sys_path(), label=label
    )


def _sys_path() -> tuple[str, ...]:
    return tuple(p for p in sys.path if p and os.path.isdir(p))


def _hooks(on_probe: Callable[[ProbeEvent], None] | None, runner: ProbeRunner | None, **fields: Any) -> Hooks:
    """What the service tells the API: probes to ``on_probe`` (else the logger), the rest to the logger."""
    from autobatch.service.hooks import Hooks

    def report(combo: Combo, outcome: ProbeOutcome, cached: bool) -> None:
        event = ProbeEvent(
            combo.precision, combo.optimizer, combo.recompute, outcome.batch_size, outcome.kind,
            outcome.peak_bytes, outcome.samples_per_second, outcome.wall_seconds, cached, outcome.reason,
        )  # fmt: skip
        if on_probe is not None:
            on_probe(event)
        else:
            logger.info("%s", event)

    def device(info: DeviceInfo) -> None:
        from autobatch.core.units import format_bytes

        logger.info(  # as the command shows it, and exact: "600MB" is decimal, "600MiB" binary
            "device %s: budget %s (%d bytes)", info.name, format_bytes(info.budget_bytes), info.budget_bytes
        )
        if info.fell_back:
            logger.warning("%s", info.notes[0])

    return Hooks(
        on_probe=report,
        on_status=logger.info,
        on_warning=logger.warning,
        on_wait=logger.info,
        on_device=device,
        on_partial=lambda result, where: logger.info(
            "partial result (%s) %s; the exception carries it as .result", result.status, where
        ),
        runner_factory=(lambda: runner) if runner is not None else None,
        **fields,
    )


def apply_recompute(model: Any, level: str = "full", classes: Sequence[str] = ()) -> tuple[str, ...]:
    """Checkpoint ``model``'s repeated blocks at a recomputation level as the probes did, so that the job
    runs what was measured: ``result.chosen.recompute_level`` (``"full"``, ``"selective"``, or ``"6/24"``: the
    first 6 of 24 blocks; ``"off"`` does nothing). ``classes``: the block classes' names (default: the
    script's ``RECOMPUTE_CLASSES`` are not known here, so those autobatch detects). Returns the classes
    wrapped; raises :class:`~autobatch.errors.NoBlocksError` when a ``K/N`` level's N is not the model's
    count of blocks."""
    if level == "off":
        return ()
    from autobatch.errors import NoBlocksError
    from autobatch.settings.levers import in_words
    from autobatch.step.recompute import wrap_recompute

    try:
        return wrap_recompute(model, tuple(classes), level)
    except NoBlocksError as exc:  # the block classes are this function's classes=, the setting's elsewhere
        exc.hint = exc.hint and in_words(exc.hint, "api").replace("recompute_classes=", "classes=")
        raise


def _log_chosen(result: TuneResult) -> None:
    if result.chosen is not None:
        c = result.chosen
        logger.info("chosen: %s/%s/recompute %s: %s", c.precision, c.optimizer, c.ident.level, c.plan_words)
