"""A probing session: one script, one device, one budget, one probe runner, one probe journal.

:meth:`Session.start` opens the runner (the probe server, or any :class:`~autobatch.records.protocol.ProbeRunner`
such as :class:`autobatch.testing.FakeRunner`), inspects the model and the device (:func:`inspect_device`: ``auto``
resolved, the budget, on the CPU the job's fresh-process offsets), and opens the journal;
:meth:`Session.probe` runs one probe of the real step (the journal's answer when it has one, the device's
margin applied), :meth:`Session.run` any other operation. What it wires lives elsewhere: the device, budgets
and margin in :mod:`autobatch.devices.budget`, the journal in :mod:`autobatch.cache`, outcomes as errors in
:mod:`autobatch.records.failures`. A session reads the run's settings whole; what it is plugged into (runner,
callbacks, a :class:`autobatch.run.locks.RunLock` held from start to close) comes in one :class:`SessionWiring`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autobatch.cache import CacheFolder, ProbeJournal, fingerprint
from autobatch.cache.sources import FilesSeen, spec_sources
from autobatch.core.space import Combo
from autobatch.core.units import format_bytes
from autobatch.devices.backend import backend_for
from autobatch.devices.budget import (
    DeviceInfo,
    apply_margin,
    cpu_budget,
    cuda_name,
    device_info,
    make_room_for_workers,
    workers_outgrew,
)
from autobatch.errors import DeviceError, UsageError
from autobatch.probe.files import deep_temp_note
from autobatch.probe.ranks import launcher_variables
from autobatch.records.failures import raise_for, with_last_lines
from autobatch.records.protocol import ProbeOutcome, ProbeRequest, ProbeRunner, RunConfig, StepConfig
from autobatch.records.result import Circumstance, warning_note
from autobatch.records.version import MEASURED_BY
from autobatch.run.lengths import plan_lengths
from autobatch.settings.levers import Door, lever, neutral
from autobatch.settings.values import plain
from autobatch.step.as_is import finder_warning
from autobatch.step.scriptpath import script_digest
from autobatch.step.spec import ScriptSpec, spec_from_settings

if TYPE_CHECKING:
    from autobatch.cache.fresh import FreshInputs, FreshStore
    from autobatch.devices.selection import Target
    from autobatch.probe.fresh import FreshAhead, FreshOptions
    from autobatch.probe.warming import Warming
    from autobatch.settings import DistributedSettings, Settings

#: Called after every probe with the combination, the outcome and whether it came from the journal.
OnProbe = Callable[[Combo, ProbeOutcome, bool], None]
#: Wraps the runner a session creates (a progress display watching each request, for instance).
WrapRunner = Callable[[ProbeRunner], ProbeRunner]


class Warnings:
    """A run's warnings, each kept and shown once: the one place they are de-duplicated. Once :meth:`keep_in`
    names a result's notes, every warning is also a ``warning: ...`` note there, as it comes (those that came
    before, at once), so that a partial result carries them too."""

    def __init__(self, show: Callable[[str], None] | None = None) -> None:
        self.show = show
        self.messages: list[str] = []
        self.notes: list[str] | None = None

    def __call__(self, message: str) -> None:
        if message in self.messages:
            return
        self.messages.append(message)
        if self.notes is not None:
            self.notes.append(warning_note(message))
        if self.show is not None:
            self.show(message)

    def keep_in(self, notes: list[str]) -> None:
        """From now on, every warning is a note in ``notes`` (the ones so far too)."""
        self.notes = notes
        notes.extend(warning_note(message) for message in self.messages)


@dataclass(frozen=True)
class SessionWiring:
    """What a session is plugged into: every field optional, ``SessionWiring()`` probes through the real
    server, shows nothing and takes no lock (:func:`autobatch.service.sessions.open_session` builds it from
    a face's hooks)."""

    runner: ProbeRunner | None = None  # a runner of the caller's (a fake one); None: start the probe server
    on_probe: OnProbe | None = None  # after every probe (see OnProbe)
    warnings: Warnings | None = None  # the run's warnings (None: the session's own, shown nowhere)
    wrap_runner: WrapRunner | None = None  # wraps the runner once, at start
    lock: AbstractContextManager[Any] | None = None  # held from start to close (a device's lock)


class Session:
    """Open with :meth:`start`; always :meth:`close` (or use it as a context manager).

    Built from the run's settings, read where they are needed (``session.settings.probe.timeout``), never
    copied: ``spec`` replaces the settings' script (callables or an object from the API), ``target`` is the
    device probed (default: the device setting as it is, with no identity), ``cache`` overrides the
    ``cache`` setting, ``refresh`` measures again (and records) instead of answering from the journal, and
    ``op_modules`` register further probe operations (:mod:`autobatch.probe.ops`).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        spec: ScriptSpec | None = None,
        target: Target | None = None,
        wiring: SessionWiring | None = None,
        cache: bool | None = None,
        refresh: bool = False,
        op_modules: tuple[str, ...] = (),
    ) -> None:
        self.settings = settings
        #: Where the step comes from; ``script`` is its path (a plain script) or its label (any other spec).
        self.spec = spec or spec_from_settings(settings)
        self.target = target
        self.wiring = wiring or SessionWiring()
        self.use_cache = settings.probe.cache if cache is None else cache
        self.refresh = refresh
        self.op_modules = op_modules
        #: Rank processes of each probe: 1 without a strategy, nproc_per_node with one.
        self.ranks = _ranks(settings.distributed)
        #: The plan's sequence length: what operations of no combination (the fresh-process measure) run at.
        self.plan_seq_len = plan_lengths(settings.search.seq_lens, settings.plan.seq_len)[1]
        self.runner = self.wiring.runner
        self.own_server = False  # the session started the probe server (a runner of the caller's: not)
        self.blocks: tuple[str, ...] = ()
        self.device: DeviceInfo | None = None
        self.journal = ProbeJournal(None)
        self.fingerprint = self.single_fingerprint = ""
        self.cache_hits = self.probes_run = 0
        self._script_digest: str | None = None
        #: Every warning of the session, once (shared with the run that wired it, which keeps them in its notes).
        self.warnings = self.wiring.warnings if self.wiring.warnings is not None else Warnings()
        self.fresh_offsets: list[int] = []  # per rank (autobatch.probe.fresh)
        # the processes a script run as it is starts are named once, with the first probe's figure
        self._children_noted = False
        self._workers_outgrew = False  # a probe's workers held more than the budget left them (warned once)
        self.fresh_ahead: FreshAhead | None = None  # the job's fresh process, started beside the probe server
        self._held = ExitStack()

    @property
    def script(self) -> str | Path:
        """The step's script path (a plain script), or its spec's label (any other spec)."""
        return Path(self.spec.target) if self.spec.is_file else self.spec.label

    @property
    def requested_device(self) -> str:
        """The device probed as asked: the target's, else the device setting's (``auto`` resolved at start)."""
        return self.target.device if self.target is not None else self.settings.device.device

    @cached_property
    def files(self) -> FilesSeen:
        """The script's files in the probes this session answered with (:mod:`autobatch.probe.files`)."""
        return FilesSeen()

    @property
    def as_is(self) -> bool:
        """The script runs as it is: its own step, one combination (:mod:`autobatch.step.as_is`)."""
        return self.spec.kind == "as_is"

    def __enter__(self) -> Session:
        # a start that fails (the script's error, Ctrl-C) leaves no probe server running and no lock held
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def torch_version(self) -> str | None:
        return self.runner.torch_version if self.runner is not None else None

    def close(self) -> None:
        try:
            if self.fresh_ahead is not None:  # started, and the session ends before it is measured
                self.fresh_ahead.cancel()
                self.fresh_ahead = None
            if self.runner is not None:
                self.runner.close()
        finally:
            self._held.close()

    def warn(self, message: str) -> None:
        """A problem the run survives: kept for the result's notes and shown by the caller (:class:`Warnings`)."""
        self.warnings(message)

    def start(self) -> DeviceInfo:
        """Open the runner, inspect the model and the device, open the journal."""
        self.spec.check()
        if self.as_is and (finder := finder_warning(self.spec.target)):
            self.warn(finder)
        if deep := deep_temp_note():
            self.warn(Circumstance(deep))  # the run's TMPDIR
        if self.as_is and self.ranks <= 1 and (named := launcher_variables(os.environ)):
            self.warn(_one_process_note(named))
        self._script_digest = script_digest(Path(self.spec.target)) if self.spec.is_file else None
        if self.wiring.lock is not None:
            self._held.enter_context(self.wiring.lock)
        if self.runner is None:
            from autobatch.probe.client import start_server

            script_args = list(self.settings.script.script_args)
            timeout = self.settings.probe.timeout
            # Forked from a warm process (the daemon's) only where its memory is not counted, or is counted
            # back by the fresh-process offset: not on the CPU device with the offset off.
            fork = self.settings.probe.fresh_baseline or self.settings.device.device.startswith("cuda")
            self.fresh_ahead = _fresh_ahead(self)
            folders = [self.fresh_ahead.root] if self.fresh_ahead is not None else []
            self.runner = start_server(
                self.spec, script_args, self.op_modules, timeout, self.warn, fork, folders, _warming(self)
            )
            self.own_server = True
        if self.wiring.wrap_runner is not None:
            self.runner = self.wiring.wrap_runner(self.runner)
        self.device = inspect_device(self)
        self._open_journal()
        return self.device

    @cached_property
    def sources(self) -> dict[str, str]:
        """The digests of the script and its local modules (a spec of callables: its content's), as the session
        starts: read once for the kept fresh process and the journal."""
        return spec_sources(self.spec)

    def _open_journal(self) -> None:
        assert self.device is not None
        sources = self.sources
        script_args, search = list(self.settings.script.script_args), self.settings.search
        identity = dict(self.target.identity) if self.target is not None else {}
        device = (self.device.name, self.device.budget_bytes)
        parts = [script_args, MEASURED_BY, self.torch_version or "", *device, plain(search.optimizer_kwargs)]
        parts += [search.recompute_classes, identity]
        if self.fresh_offsets:  # counted as the job's fresh process: other figures than a forked one's
            parts.append("fresh process")
        if self.as_is:  # how the batch reaches the script
            parts.append(dict(self.spec.options))
        # a strategy's probes are other measurements; single-process fingerprints stay as they were, and the
        # strategy's first probe is predicted from them (autobatch.run.rank_priors)
        self.single_fingerprint = fingerprint(sources, parts)
        strategy = self.settings.distributed.strategy
        ranked = (strategy, self.ranks) if strategy != "none" else ()
        self.fingerprint = fingerprint(sources, [*parts, *ranked])
        if self.use_cache:
            meta = {
                "script": str(self.script),
                "script_args": script_args,
                "device": self.device.name,
                "identity": identity,
                "budget_bytes": self.device.budget_bytes,
                "torch": self.torch_version,
                "autobatch": MEASURED_BY,
            }
            self.journal = ProbeJournal.open(
                CacheFolder(self.settings.probe.cache_dir, warn=self.warn), self.fingerprint, meta
            )

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
        device: str | None = None,
    ) -> ProbeRequest:
        """The request for one operation on this session's device (``budget_bytes``: the budget's by default;
        ``device``: another one, such as a device inspected before the session's is known)."""
        known = self.device
        if device is None or budget_bytes is None:
            assert known is not None, "start() the session first"
            device, budget_bytes = (
                device or known.name,
                known.budget_bytes if budget_bytes is None else budget_bytes,
            )
        ranked = op in RANKED_OPS
        run = run_config(
            self.settings,
            known,
            budget_bytes,
            timeout=timeout,
            ranks=self.ranks if ranked else 0,
            fresh_offsets=self.fresh_offsets,
        )
        op = "as_is" if self.as_is and op == "probe" else op  # the script's own step (probe.as_is)
        return build_request(
            self.settings, combo, batch_size, device, run, steps=steps, op=op, options=options
        )

    def run(self, request: ProbeRequest, *, what: str) -> ProbeOutcome:
        """Run any operation, unjournaled; the script's own error raises, a crash or timeout is an outcome."""
        assert self.runner is not None, "start() the session first"
        outcome = self.runner.run(request)
        if outcome.kind == "error":
            raise_for(outcome, what=what)
        return outcome

    def journaled(self, combo: Combo, lengths: tuple[tuple[int, int], ...]) -> list[ProbeOutcome]:
        """Every answer the journal holds for ``combo`` at these probe lengths, margin applied, in order. A
        resumed search starts from all of them: asked one batch at a time, it would reuse only those its path
        reaches again, and that path moves with the probe process's baseline memory, which varies by run."""
        if not self.use_cache or self.refresh:
            return []
        assert self.device is not None
        answers = self.journal.answers(
            (*combo.ident, combo.seq_len), lengths, self.settings.probe.timeout, self.device.margin_line
        )
        answers = [outcome for outcome in answers if self.files.unchanged(outcome)]
        for outcome in answers:
            self.files.take(outcome)
            apply_margin(outcome, self.device)
            self.cache_hits += 1
            if self.wiring.on_probe:
                self.wiring.on_probe(combo, outcome, True)
        return answers

    def probe(
        self,
        combo: Combo,
        batch_size: int,
        *,
        min_steps: int,
        max_steps: int,
        strict: bool = True,
        fresh: bool = False,
        timing: bool = False,
    ) -> ProbeOutcome:
        """One probe of the real step (journaled); raises ScriptError/ContractError when the script fails.
        ``strict`` (the search's verdict) turns a fit whose peak comes within the device's margin of the
        budget into an out-of-memory outcome that says so; ``check`` asks only what the cap says. ``fresh``
        runs it even when the journal has its answer (a timing probe measures time: a journaled one again
        would count as a second probe that agrees). ``timing``: a timing probe
        (:attr:`~autobatch.records.protocol.ProbeRequest.timing`)."""
        assert self.device is not None
        request = replace(self.request(combo, batch_size, steps=(min_steps, max_steps)), timing=timing)
        if strict:
            request = replace(request, stop_above_bytes=self.device.margin_line)
        outcome = self.journal.get(request) if self.use_cache and not (self.refresh or fresh) else None
        if outcome is not None and not self.files.unchanged(outcome):
            outcome = None  # a file it read changed since: measured again
        cached = outcome is not None
        if outcome is None:
            self._check_script_unchanged()
            started = time.time()
            outcome = self._run_retrying(request)
            outcome.started_at = started
            self.probes_run += 1
            self.files.take(outcome)
            self.journal.record(request, outcome)
        else:
            self.files.take(outcome)
            self.cache_hits += 1
        if strict:
            apply_margin(outcome, self.device)
        if outcome.info.get("note") and self.device.type == "cpu" and not self._children_noted:
            # processes the script started: not counted (their figure, once), unless the note that lowered the
            # budget for them has it
            self._children_noted = True
            if self.device.workers_bytes is None:
                self.warn(str(outcome.info["note"]))
        if (
            outcome.fits
            and (outgrew := workers_outgrew(self.device, outcome, self.settings.door))
            and not self._workers_outgrew
        ):
            self._workers_outgrew = True
            self.warn(outgrew)
        for note in outcome.info.get("script_notes", []):  # what a script run as it is does of its own
            self.warn(str(note))
        if self.wiring.on_probe:
            self.wiring.on_probe(combo, outcome, cached)
        if outcome.kind == "error":
            if self.as_is:
                with_last_lines(outcome)
            raise_for(outcome, what=f"{combo.key} at batch {batch_size}")
        return outcome

    def _check_script_unchanged(self) -> None:
        """The probe server imported the script once: an edit since then would make later probes measure a
        file that no longer exists, under the old file's fingerprint. Stop and say so."""
        if self._script_digest is not None and script_digest(Path(self.script)) != self._script_digest:
            raise UsageError(
                f"{Path(self.script).name} changed while it was being tuned (after {self.probes_run} probes): the "
                "probes measured the version the run started with, and the answer would not describe the file now",
                hint="re-run once the script is final: the earlier version's probes stay in the probe journal",
            )

    def _run_retrying(self, request: ProbeRequest) -> ProbeOutcome:
        """Run a probe; a crash or timeout says nothing about memory: once more, and only a second one stands."""
        assert self.runner is not None, "start() the session first"
        outcome = self.runner.run(request)
        if outcome.kind not in RETRIED:
            return outcome
        again = self.runner.run(request)
        if again.kind in RETRIED:
            again.reason = f"{again.reason} (twice: retried once in a fresh process)"
        return again


RANKED_OPS = (
    "probe",
    "explain",
    "fresh_baseline",
)  # on every rank of a strategy; inspect, estimate: one process

#: Outcomes that are retried once: a probe that died or hung says nothing about memory.
RETRIED = ("crash", "timeout")


def step_config(settings: Settings, combo: Combo, batch_size: int, device: str) -> StepConfig:
    """The step a probe of ``combo`` builds, as the settings shape it: the one place a combination and the
    settings become a :class:`~autobatch.records.protocol.StepConfig`."""
    return StepConfig(
        batch_size=batch_size,
        precision=combo.precision,
        optimizer=combo.optimizer,
        level=combo.level,
        device=device,
        optimizer_kwargs=dict(settings.search.optimizer_kwargs.get(combo.optimizer, {})),
        recompute_classes=tuple(settings.search.recompute_classes),
        check_batch_size=settings.script.check_batch_size,
        seq_len=combo.seq_len,
        compile=combo.compile,
    )


def run_config(
    settings: Settings,
    device: DeviceInfo | None,
    budget_bytes: int,
    *,
    timeout: float | None = None,
    ranks: int = 0,
    fresh_offsets: list[int] | tuple[int, ...] = (),
) -> RunConfig:
    """How the run holds a probe, from the device (its per-process limit, where known) and the settings (the
    timeout, unless ``timeout``; the strategy, on ``ranks`` ranks, or one process when 0): the one place they
    become a :class:`~autobatch.records.protocol.RunConfig`."""
    strategy = settings.distributed.strategy if ranks else "none"
    return RunConfig(
        budget_bytes=budget_bytes,
        timeout=settings.probe.timeout if timeout is None else timeout,
        process_limit_bytes=device.process_limit_bytes if device is not None else None,
        strategy=strategy,
        nproc_per_node=ranks or 1,
        fresh_offset_bytes=tuple(fresh_offsets),
    )


def build_request(
    settings: Settings,
    combo: Combo,
    batch_size: int,
    device: str,
    run: RunConfig,
    *,
    steps: tuple[int, int],
    op: str = "probe",
    options: dict[str, Any] | None = None,
) -> ProbeRequest:
    """One operation's request: the step of ``combo`` as the settings shape it (:func:`step_config`), held as
    ``run`` says, for ``steps`` (at least, at most)."""
    return ProbeRequest(
        step=step_config(settings, combo, batch_size, device),
        run=run,
        min_steps=steps[0],
        max_steps=steps[1],
        op=op,
        options=dict(options or {}),
    )


def _ranks(distributed: DistributedSettings) -> int:
    """The rank processes of each probe: one without a strategy, at least two with one."""
    if distributed.strategy == "none":
        return 1
    if distributed.nproc_per_node < 2:
        raise UsageError(
            f"strategy {distributed.strategy} measures every rank, but nproc_per_node is "
            f"{distributed.nproc_per_node}",
            hint=f"pass {neutral('nproc_per_node', 2)} (or more), or {neutral('strategy', 'none')}",
        )
    return distributed.nproc_per_node


# --- what a session learns before its first probe: the device, the model, and on the CPU the job's own
# process (docs/how-a-tune-works.md, "Budget") -------------------------------------------

#: The note (first in the result's notes) of a ``--device auto`` that found no CUDA device.
FALLBACK_NOTE = (
    "device auto found no CUDA device (torch {torch}) and tuned on the CPU: these numbers hold for CPU "
    "training only; launcher configs for GPU jobs are refused unless allow_cpu is set"
)

#: The fresh-process measurement's step: any combination (every optimizer imports the same modules lazily)
#: at a small batch (what differs is the process, not the batch; 2, as BatchNorm fails at 1).
FRESH_COMBO = Combo("32-true", "sgd")
FRESH_BATCH = 2
#: What the inspection builds: the model alone (its step is never run).
INSPECT_COMBO = Combo("32-true", "sgd")


def inspect_device(session: Session) -> DeviceInfo:
    """The session's device with what inspecting the model found (and, on the CPU, the fresh-process offsets
    in ``session.fresh_offsets``)."""
    device, info = _resolve(session)
    session.blocks = tuple(info.get("recompute_blocks", ()))  # what recomputation and FSDP wrap
    asked = session.settings.device
    memory = asked.memory
    backend = backend_for(device)
    if memory is None and backend.ranks_share_memory and session.ranks > 1 and info.get("available_bytes"):
        memory = int(info["available_bytes"]) // session.ranks  # the ranks share the machine
    found = device_info(device, info, memory=memory, headroom=asked.headroom, door=session.settings.door)
    found.requested = asked.device  # "auto" stays "auto" when a target was picked for it
    if found.fell_back:
        found.notes.insert(0, FALLBACK_NOTE.format(torch=session.torch_version))
    session.device = found
    ranks_as_is = session.as_is and session.ranks > 1  # a script's own ranks: not yet measured
    # a runner of the caller's (a fake one, an in-process one) measures what it measures
    fresh = session.settings.probe.fresh_baseline and session.own_server
    if backend.fresh_process_differs and fresh and not ranks_as_is:
        _measure_fresh_offsets(session, found)
    return found


def _resolve(session: Session) -> tuple[str, dict[str, Any]]:
    """``auto`` -> CUDA when torch sees it, else the CPU; the inspection of the chosen device."""
    info = _inspect(session, "cpu")
    device = session.requested_device
    if device == "auto":
        device = "cuda:0" if info.get("cuda_available") else "cpu"
    elif device.startswith("cuda") and not info.get("cuda_available"):
        raise DeviceError(
            f"{lever(session.settings.door, 'device', device)} asked for, but torch sees no CUDA device "
            f"(torch {session.torch_version})",
            hint=f"use {lever(session.settings.door, 'device', 'cpu')} (or auto), or install a CUDA build of torch "
            "on a machine with a GPU",
        )
    return device, info if device == "cpu" else _inspect(session, cuda_name(device))


def _inspect(session: Session, device: str) -> dict[str, Any]:
    """What building the model (an as-is script: the device alone) found. On the CPU, with the cache on and no
    ``--refresh``, a server forked from the daemon's warm process may replay what an earlier command's inspection
    of the same script found (:meth:`autobatch.probe.client.ProbeClient.run`)."""
    from autobatch.probe.client import REPLAYABLE

    op = "as_is_inspect" if session.as_is else "inspect"
    replayable = device == "cpu" and session.settings.probe.cache and not session.refresh
    options = {REPLAYABLE: True} if replayable else None
    request = session.request(
        INSPECT_COMBO, 0, steps=(0, 0), op=op, budget_bytes=0, device=device, options=options
    )
    outcome = session.run(request, what="building the model")
    raise_for(outcome, what="building the model")
    return outcome.info


def _measure_fresh_offsets(session: Session, device: DeviceInfo) -> None:
    """How much more the job's fresh process of each rank holds than a forked probe process, into
    ``session.fresh_offsets`` and the device's record; a warning when it cannot be measured."""
    from autobatch.cache.fresh import KeptFresh
    from autobatch.probe.fresh import FreshOptions

    assert session.runner is not None
    where = _fresh_store(session, device.name, session.torch_version or "")  # None: the cache is off
    kept = None
    if where is not None and not session.refresh:  # --refresh: measured again, and the kept one replaced
        store, inputs = where
        kept = store.get(inputs)
    ahead, session.fresh_ahead = session.fresh_ahead, None
    script_args = list(session.settings.script.script_args)
    options = FreshOptions(session.spec.to_init(), script_args, kept=kept.job_bytes if kept else None)
    request = _fresh_request(session, options)
    if kept is None and ahead is not None and ahead.request == request:
        options = replace(options, measured=ahead.outcomes())
        request = _fresh_request(session, options)
    elif ahead is not None:  # a kept one under the server's torch, or another request: not to compete with it
        ahead.cancel()
    outcome = session.runner.run(request)
    # a broken contract (make_batch takes no length, say) fails every probe too: report it now, not as a warning
    if outcome.kind == "error" and outcome.contract:
        raise_for(outcome, what="measuring the job's fresh process")
    offsets = outcome.info.get("offset_bytes") if outcome.fits else None
    if not offsets:
        why = outcome.info.get("fresh_error") or outcome.reason or outcome.error_message or outcome.kind
        session.warn(
            f"the job's fresh process could not be measured against a forked probe ({why}): maxima count as a "
            "forked process's, which can be a few percent above a fresh one's near the cap"
        )
        return
    session.fresh_offsets = [int(offset) for offset in offsets]
    device.fresh_process = {"batch_size": FRESH_BATCH, **outcome.info}
    if options.measured:
        device.fresh_process["beside_server"] = True
    if kept is not None:
        device.fresh_process["kept"] = kept.made
    elif where is not None:
        store, inputs = where
        store.put(
            inputs, KeptFresh.now(outcome.info["job_bytes"]), str(session.script), list(outcome.files_read)
        )
    device.notes.append(fresh_note(session.fresh_offsets, kept.made if kept else None, session.settings.door))
    own = device.fresh_process.get("child_own_bytes")
    if own:
        make_room_for_workers(device, int(own), int(device.fresh_process.get("child_processes", 0)))
    if device.baseline_bytes is not None:
        device.baseline_bytes += session.fresh_offsets[0]
        # counted as the job's fresh process, the probe process may hold the whole budget before building (a
        # script that loads a library reserving address space, uncapped, in the job's process)
        cpu_budget(device.capacity_bytes, device.headroom, device.baseline_bytes, session.settings.door)


def _fresh_request(
    session: Session, options: FreshOptions, device: str | None = None, budget: int | None = None
) -> ProbeRequest:
    """The request that measures the job's fresh process (on the session's device, or ``device`` with
    ``budget`` before it is known)."""
    return session.request(
        FRESH_COMBO.at(session.plan_seq_len),
        FRESH_BATCH,
        steps=(3, 3),
        op="fresh_baseline",
        options=options.to_dict(),
        budget_bytes=budget,
        device=device,
    )


def _warming(session: Session) -> Warming:
    """What the device probed allows the probe server's warm-up (:class:`autobatch.probe.warming.Warming`): on
    the CPU device with its memory given, threads that keep a fork safe, the imports under the budget; on a GPU,
    those threads, no limit; otherwise (``auto`` unresolved, or the CPU's memory read at the inspection) the
    plain case. Every command's session has its target, ``auto`` resolved from the inventory
    (:func:`autobatch.service.sessions.open_session`); only one built without a target keeps ``auto``."""
    from autobatch.probe.warming import Warming

    device = session.requested_device
    budget = _budget_ahead(device, session)
    if budget is not None:
        return Warming(fork_safe=True, data_limit=budget)
    return Warming(fork_safe=device.startswith("cuda"))


def _budget_ahead(device: str, session: Session) -> int | None:
    """The budget before the inspection measures anything: the CPU device's, when its memory is given (None
    otherwise: a GPU's comes from the inspection, and so does the CPU's capacity without ``--memory``)."""
    asked = session.settings.device
    if device != "cpu" or asked.memory is None:
        return None
    return cpu_budget(asked.memory, asked.headroom, None, session.settings.door)


def _one_process_note(named: dict[str, str]) -> Circumstance:
    """What a single-process tune of a script says when the environment names a worker of a launched job."""
    key = [
        f"{name}={named[name]}"
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        if name in named
    ]
    shown = " ".join(key or [f"{name}={value}" for name, value in named.items()][:4])
    shown += " ..." if len(named) > len(shown.split()) else ""
    return Circumstance(
        f"the environment names a worker of a launched job ({shown}): each probe runs the script as one process, "
        "rank 0 of a world of one with a rendezvous of its own (RANK=0, WORLD_SIZE=1, MASTER_PORT=0), as "
        f"`torchrun --nproc-per-node 1` starts it; to measure the job's ranks, set the ranks per node ({neutral('nproc_per_node')})"
    )


def _fresh_ahead(session: Session) -> FreshAhead | None:
    """The job's fresh process started now, beside the probe server's start, where the run will measure it: the
    CPU device named with its memory (the budget, known before the inspection), the offset on, none kept, and
    a probe server that starts as a fresh Python (a thread of the command keeps a warm one from forking it)."""
    from autobatch.probe import forked
    from autobatch.probe.client import server_env
    from autobatch.probe.fresh import FreshAhead, FreshOptions

    env = {**os.environ, **server_env()}
    budget = _budget_ahead(session.settings.device.device, session)  # the device as asked: a target's
    if budget is None or not session.settings.probe.fresh_baseline:
        return None
    if (session.as_is and session.ranks > 1) or forked.why_cold(env, _warming(session)) is None:
        return None
    where = _fresh_store(session, "cpu")  # before a server reports its torch: the installed one's version
    if where is not None and not session.refresh and where[0].get(where[1]) is not None:
        return None
    options = FreshOptions(session.spec.to_init(), list(session.settings.script.script_args))
    request = _fresh_request(session, options, "cpu", budget)
    return FreshAhead(request, options, env)


def _fresh_store(
    session: Session, device: str, torch: str | None = None
) -> tuple[FreshStore, FreshInputs] | None:
    """Where the job's fresh process is kept and what it depends on (None: the cache is off); ``torch``: the
    version the probe server reported (None: the installed one's, :func:`autobatch.cache.keys.versions`)."""
    from autobatch.cache.fresh import FreshInputs, FreshStore, interpreter
    from autobatch.cache.keys import versions
    from autobatch.devices.cpu import cores, environment

    if not session.settings.probe.cache:
        return None

    strategy = session.settings.distributed.strategy
    step = {
        "device": device,
        "ranks": [strategy, session.ranks] if strategy != "none" else None,
        "seq_len": session.plan_seq_len,
        "as_is": dict(session.spec.options) if session.as_is else None,
        "cores": cores(),
    }
    inputs = FreshInputs(
        sources=session.sources,
        script_args=list(session.settings.script.script_args),
        versions={**versions(), **({"torch": torch} if torch is not None else {})},
        step=step,
        interpreter=interpreter(),
        environment=environment(),
    )
    return FreshStore(CacheFolder(session.settings.probe.cache_dir, warn=session.warn)), inputs


def fresh_note(offsets: list[int], kept: str | None = None, door: Door = "cli") -> str:
    """The result's note on the fresh-process offsets (one, or one per rank); ``kept``: when the fresh half
    was measured, by an earlier run (:mod:`autobatch.cache.fresh`), and how ``door`` measures both again."""

    def signed(offset: int) -> str:
        return ("+" if offset >= 0 else "") + format_bytes(offset)

    if len(offsets) == 1:
        who = f"the job's fresh process: {signed(offsets[0])} against a probe forked"
    else:
        each = ", ".join(f"rank {rank} {signed(offset)}" for rank, offset in enumerate(offsets))
        who = f"the job's fresh rank processes, started as torchrun starts them: {each} against ranks forked"
    if kept is None:
        return (
            f"probes count as {who} from the probe server (measured once per run, after the steps of batch "
            f"{FRESH_BATCH})"
        )
    return (
        f"probes count as {who} from the probe server (the fresh process as measured at {kept} and kept in "
        f"the cache, the forked one in this run, after the steps of batch {FRESH_BATCH}; {lever(door, 'cache', False)} "
        "measures both)"
    )
