"""A probing session: one script, one device, one budget, one probe runner, one probe journal.

:meth:`Session.start` opens the runner (the probe server, unless a runner is given: any object with
the :class:`~autobatch.probe.protocol.ProbeRunner` protocol, such as :class:`autobatch.testing.FakeRunner`),
inspects the model and the device, and opens the journal. :meth:`Session.probe` runs one probe of
the real step, reusing the journal's outcome when there is one and applying the device's margin;
:meth:`Session.run` runs any other operation. The parts it wires live elsewhere: the device record,
budgets and margin in :mod:`autobatch.devices.budget`, the journal in :mod:`autobatch.probe.journal`,
the translation of outcomes into errors in :mod:`autobatch.probe.failures`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import __version__
from .core.space import Combo
from .core.units import format_bytes
from .devices.budget import DeviceInfo, cuda_name, device_info
from .devices.cpu import MALLOC_ENV
from .errors import DeviceError
from .probe.failures import raise_for
from .probe.journal import ProbeJournal, fingerprint
from .probe.protocol import ProbeOutcome, ProbeRequest, ProbeRunner
from .spec import ScriptSpec, select_spec

if TYPE_CHECKING:
    from .settings import Settings

#: Called after every probe with the combination, the outcome and whether it came from the journal.
OnProbe = Callable[[Combo, ProbeOutcome, bool], None]
#: The note (first in the result's notes) of a ``--device auto`` that found no CUDA device.
FALLBACK_NOTE = (
    "device auto found no CUDA device (torch {torch}) and tuned on the CPU: these numbers hold for CPU "
    "training only; launcher configs for GPU jobs are refused unless allow_cpu is set"
)


def spec_from_settings(settings: Settings) -> ScriptSpec:
    """Where the settings say the step comes from: ``script``, ``hf`` or ``lightning`` (see :func:`select_spec`)."""
    values = {f: settings.get(f) for f in ("script", "hf", "hf_task", "seq_len", "lightning", "datamodule")}
    values["lightning_config"] = settings.script.lightning_config
    values["batch_attr"] = settings.output.lightning_batch_key.rpartition(".")[2]
    return select_spec(values, settings.origin)


class Session:
    """Open with :meth:`start`; always :meth:`close` (or use it as a context manager)."""

    def __init__(
        self,
        *,
        script: str | Path | ScriptSpec,
        script_args: tuple[str, ...] | list[str],
        device: str,
        memory: int | None,
        headroom: float,
        timeout: float,
        optimizer_kwargs: dict[str, dict[str, Any]] | None = None,
        recompute_classes: tuple[str, ...] = (),
        cache: bool = True,
        cache_dir: str | None = None,
        on_probe: OnProbe | None = None,
        runner: ProbeRunner | None = None,
    ) -> None:
        #: Where the step comes from; ``script`` is its path (a plain script) or its label (any other spec).
        self.spec = script if isinstance(script, ScriptSpec) else ScriptSpec.file(script)
        self.script: str | Path = Path(self.spec.target) if self.spec.kind == "path" else self.spec.label
        self.script_args = list(script_args)
        self.requested_device = device
        self.memory = memory
        self.headroom = headroom
        self.timeout = timeout
        self.optimizer_kwargs = optimizer_kwargs or {}
        self.recompute_classes = tuple(recompute_classes)
        self.use_cache = cache
        self.cache_dir = cache_dir
        self.on_probe = on_probe
        self.runner = runner
        self.device: DeviceInfo | None = None
        self.journal = ProbeJournal(None)
        self.fingerprint = ""
        self.cache_hits = 0

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        cache: bool | None = None,
        on_probe: OnProbe | None = None,
        runner: ProbeRunner | None = None,
        spec: ScriptSpec | None = None,
    ) -> Session:
        """The session that resolved settings describe (``cache`` defaults to the ``cache`` setting;
        ``spec``, where the step comes from, to the one the settings name)."""
        return cls(
            script=spec or spec_from_settings(settings),
            script_args=settings.script.script_args,
            device=settings.device.device,
            memory=settings.device.memory,
            headroom=settings.device.headroom,
            timeout=settings.probe.timeout,
            optimizer_kwargs={k: dict(v) for k, v in settings.search.optimizer_kwargs.items()},
            recompute_classes=settings.search.recompute_classes,
            cache=settings.probe.cache if cache is None else cache,
            cache_dir=settings.probe.cache_dir,
            on_probe=on_probe,
            runner=runner,
        )

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def torch_version(self) -> str | None:
        return self.runner.torch_version if self.runner is not None else None

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()

    def start(self) -> DeviceInfo:
        """Open the runner, inspect the model and the device, open the journal."""
        self.spec.check()
        if self.runner is None:
            from .probe.client import ProbeClient

            self.runner = ProbeClient(self.spec.to_init(), self.script_args, env=dict(MALLOC_ENV))
        device, info = self._resolve_device()
        self.device = device_info(device, info, memory=self.memory, headroom=self.headroom)
        self.device.requested = self.requested_device
        if self.device.fell_back:
            self.device.notes.insert(0, FALLBACK_NOTE.format(torch=self.torch_version))
        self._open_journal()
        return self.device

    def _resolve_device(self) -> tuple[str, dict[str, Any]]:
        """``auto`` -> CUDA when torch sees it, else the CPU; the inspection of the chosen device."""
        info = self._inspect("cpu")
        device = self.requested_device
        if device == "auto":
            device = "cuda:0" if info.get("cuda_available") else "cpu"
        elif device.startswith("cuda") and not info.get("cuda_available"):
            raise DeviceError(
                f"--device {device} asked for, but torch sees no CUDA device (torch {self.torch_version})",
                hint="use --device cpu (or auto), or install a CUDA build of torch on a machine with a GPU",
            )
        return device, info if device == "cpu" else self._inspect(cuda_name(device))

    def _inspect(self, device: str) -> dict[str, Any]:
        request = ProbeRequest(
            batch_size=0,
            precision="32-true",
            optimizer="sgd",
            recompute=False,
            device=device,
            budget_bytes=0,
            timeout=self.timeout,
            recompute_classes=self.recompute_classes,
            op="inspect",
        )
        outcome = self.run(request, what="building the model")
        raise_for(outcome, what="building the model")
        return outcome.info

    def _open_journal(self) -> None:
        assert self.device is not None
        self.fingerprint = fingerprint(
            self.spec.content(),
            (
                self.script_args,
                __version__,
                self.torch_version or "",
                self.device.name,
                self.device.budget_bytes,
                self.optimizer_kwargs,
                self.recompute_classes,
            ),
        )
        if self.use_cache:
            self.journal = ProbeJournal.open(self.cache_dir, self.fingerprint)

    # -- operations ----------------------------------------------------------------------------

    def request(
        self,
        combo: Combo,
        batch_size: int,
        *,
        steps: tuple[int, int],
        op: str = "probe",
        options: dict[str, Any] | None = None,
        budget_bytes: int | None = None,
        timeout: float | None = None,
    ) -> ProbeRequest:
        """The request for one operation on this session's device (``budget_bytes``: the budget's by default)."""
        assert self.device is not None
        return ProbeRequest(
            batch_size=batch_size,
            precision=combo.precision,
            optimizer=combo.optimizer,
            recompute=combo.recompute,
            device=self.device.name,
            budget_bytes=self.device.budget_bytes if budget_bytes is None else budget_bytes,
            min_steps=steps[0],
            max_steps=steps[1],
            timeout=self.timeout if timeout is None else timeout,
            optimizer_kwargs=dict(self.optimizer_kwargs.get(combo.optimizer, {})),
            recompute_classes=self.recompute_classes,
            op=op,
            options=dict(options or {}),
            process_limit_bytes=self.device.process_limit_bytes,
        )

    def run(self, request: ProbeRequest, *, what: str) -> ProbeOutcome:
        """Run any operation, unjournaled; the script's own error raises, a crash or timeout is an outcome."""
        assert self.runner is not None, "start() the session first"
        outcome = self.runner.run(request)
        if outcome.kind == "error":
            raise_for(outcome, what=what)
        return outcome

    def probe(
        self, combo: Combo, batch_size: int, *, min_steps: int, max_steps: int, strict: bool = True
    ) -> ProbeOutcome:
        """One probe of the real step (journaled); raises ScriptError/ContractError when the script fails.

        ``strict`` (the search's verdict) turns a fit whose peak comes within the device's margin of
        the budget into an out-of-memory outcome that says so; ``check`` asks only what the cap says.
        """
        assert self.device is not None
        request = self.request(combo, batch_size, steps=(min_steps, max_steps))
        outcome = self.journal.get(request) if self.use_cache else None
        cached = outcome is not None
        if outcome is None:
            assert self.runner is not None, "start() the session first"
            outcome = self.runner.run(request)
            self.journal.record(request, outcome)
        else:
            self.cache_hits += 1
        if strict:
            apply_margin(outcome, self.device)
        if self.on_probe:
            self.on_probe(combo, outcome, cached)
        if outcome.kind == "error":
            raise_for(outcome, what=f"{combo.key} at batch {batch_size}")
        return outcome


def apply_margin(outcome: ProbeOutcome, device: DeviceInfo) -> bool:
    """Turn a fit whose peak came within the device's margin of the budget into an out-of-memory outcome.

    Returns whether it did. The search never stands on a batch that fitted by less than the variation
    between processes (:mod:`autobatch.devices.budget`).
    """
    if not (outcome.fits and device.too_close(outcome.peak_bytes)):
        return False
    outcome.kind = "oom"
    outcome.reason = (
        f"fitted by less than the {format_bytes(device.margin_bytes)} margin (peak {format_bytes(outcome.peak_bytes)} of "
        f"{format_bytes(device.budget_bytes)}): a fresh process can exceed the budget"
    )
    return True
