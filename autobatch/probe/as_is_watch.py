"""The watch on a script run as it is: the script as ``__main__`` in a probe process, its steps hooked.

The script runs as the job runs it (``sys.argv`` with ``{batch}`` filled in, ``AUTOBATCH_BATCH_SIZE``, the
same budget hooks); an optimizer step post-hook reads the peak and the time at every step of the first
optimizer that steps and, once :class:`autobatch.core.step_peaks.StepRule` says the steps are enough, reports
and ends the process. An out-of-memory error is seen where it is raised (:class:`OomWatch`), even when the
script catches it. What a probe is and what each ending means: docs/as-is.md ("What a probe is", "What can
go wrong, and the answer"); memory that arrives later is :mod:`autobatch.probe.as_is_late`'s.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from autobatch.core.space import variant_of
from autobatch.core.step_peaks import StepRule
from autobatch.devices.backend import DeviceBackend, backend_for
from autobatch.errors import ContractError
from autobatch.probe import files
from autobatch.probe.as_is_late import LateMemory
from autobatch.probe.oom import classify_exception
from autobatch.probe.worker import _read_report, _stopped_at_line
from autobatch.records.failures import NOTHING_OF_MEMORY, describe_failure
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.settings.levers import neutral
from autobatch.step.as_is import AsIsScript, accumulation, accumulation_note, not_counted_note

#: Share of the probe's timeout after which a script that has not stepped its optimizer is stopped with
#: "no optimizer step seen" (before the server's kill, which could only say "timeout").
NO_STEP_SHARE = 0.9
#: Exception types an out-of-memory error can have (a quick test before the classification proper).
_OOM_TYPES: tuple[type[BaseException], ...] = (RuntimeError, MemoryError)


def run_script(
    request: ProbeRequest, script: AsIsScript, emit: Callable[[ProbeOutcome], None]
) -> ProbeOutcome:
    """The script as ``__main__`` under the request's budget, watched (:class:`StepWatch`); ``emit`` writes
    an outcome the hooks reach inside the script's loop."""
    start = time.perf_counter()
    outcome = ProbeOutcome(kind="fits", batch_size=request.batch_size, budget_bytes=request.budget_bytes)
    os.environ.update(script.environment(request.batch_size, request.step.seq_len))
    sys.argv = script.argv(request.batch_size, variant_of(request.step.precision), request.step.seq_len)
    sys.path.insert(0, str(script.path.parent))
    files.install(outcome, script.path)  # from a scratch folder: the user's files stay as they were
    device = backend_for(request.device)
    device.apply(request, outcome)
    outcome.setup_seconds = time.perf_counter() - start
    watch = StepWatch(request, outcome, device, emit)
    watch.install()
    code: object = 0
    try:
        runpy.run_path(str(script.path), run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException as exc:  # noqa: BLE001 - everything the script raises becomes data
        return watch.raised(exc)
    return watch.ended(script.path.name, code)


class StepWatch:
    """The hooks on every optimizer step of a probe of a script run as it is (see the module docstring)."""

    def __init__(
        self,
        request: ProbeRequest,
        outcome: ProbeOutcome,
        device: DeviceBackend,
        emit: Callable[[ProbeOutcome], None],
    ) -> None:
        from autobatch.step.loop import StepReport

        self.request, self.outcome, self.emit = request, outcome, emit
        self.reported = False  # a rank's fit is reported once, and its script goes on
        self.device = device
        self.report = StepReport()
        self.first: int | None = None  # id() of the optimizer whose steps count
        self.optimizers: dict[int, Any] = {}
        self.last = time.perf_counter()
        self.rule = StepRule.under(
            request.budget_bytes, request.min_steps, request.max_steps, request.stop_above_bytes
        )
        self.late = LateMemory(request)  # optimizers built and stepped, backward passes, frozen parameters
        self.backwards = BackwardCount(self._backward)
        self.loaders = LoaderSizes()

    def install(self) -> None:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        register_optimizer_step_pre_hook(self._before)
        register_optimizer_step_post_hook(self._after)
        OomWatch(self).install()
        self.late.install()
        self.backwards.install()
        self.loaders.install()
        deadline = self.request.timeout * NO_STEP_SHARE
        if deadline > 0:
            signal.signal(signal.SIGALRM, self._no_step)
            signal.setitimer(signal.ITIMER_REAL, deadline)

    # -- the hooks --------------------------------------------------------------------------------

    def _before(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """The first step: the forward and backward phase alone, read before the step; or, when the step
        is given a closure (Lightning's ``optimizer.step(closure=...)`` runs the forward and backward
        inside the step), once that closure has returned: a pre-hook may replace the step's arguments,
        so the closure is wrapped."""
        if self.first is not None or self.reported:
            return None
        self.first = id(optimizer)
        closure = kwargs.get("closure", args[0] if args else None)
        if not callable(closure):
            self._backward_done(optimizer)
            return None

        def measured(*a: Any, **k: Any) -> Any:
            result = closure(*a, **k)
            if self.report.first_backward_peak is None:  # its first call (LBFGS calls it again)
                self._backward_done(optimizer)
            return result

        if "closure" in kwargs:
            return args, {**kwargs, "closure": measured}
        return (measured, *args[1:]), kwargs

    def _backward_done(self, optimizer: Any) -> None:
        self.device.synchronize()
        self.report.first_backward_peak = self.device.peak()
        self.report.grad_bytes = _tensor_bytes(
            p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None
        )

    def _after(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizers[id(optimizer)] = optimizer
        self.late.step(optimizer, self.report.steps)
        if id(optimizer) != self.first or self.reported:
            return
        self.device.synchronize()
        now = time.perf_counter()
        self.report.step_seconds.append(now - self.last)
        self.last = now
        self.backwards.lap(len(self.optimizers))
        self.report.step_peaks.append(self.device.peak())
        self.report.steps = len(self.report.step_peaks)
        since = self.late.counted_from(self.report.steps)  # None: an optimizer built has not stepped yet
        why = self.rule.why_stop(self.report.step_peaks[since or 0 :])
        if why == "above" or (why is not None and since is not None):
            self.report.stopped_above = why == "above"
            self.reported = True
            self.emit(self._measured())

    def _backward(self) -> None:
        error = self.late.backward()
        if error is not None and not self.reported:
            self.emit(self._failed(error))

    def _no_step(self, signum: int, frame: FrameType | None) -> None:
        if self.report.steps or self.reported:
            return  # stepping, only slowly: the server's timeout answers
        seconds = self.request.timeout * NO_STEP_SHARE
        seen = f"no optimizer step seen within {seconds:g} s at batch {self.request.batch_size}"
        children = _children()
        if children and not self.backwards.count and self.report.first_backward_peak is None:
            error = ContractError(
                f"{seen}, and no backward pass in the script's own process, while it runs {children} process(es) "
                "it started: training in a process of its own (torch.multiprocessing.spawn, "
                "multiprocessing.Process) is out of the probe's sight",
                hint="call the training function in the script's own process for the tune (mp.spawn(train, "
                "nprocs=1) is train(0)), or start its ranks with torchrun and tune them with "
                f"{neutral('nproc_per_node')} N",
            )
        else:
            error = ContractError(
                seen,
                hint="autobatch ends a script run as it is after its optimizer steps, seen through torch.optim's "
                "step hooks: an optimizer that is not a torch.optim.Optimizer is never seen. If the script is "
                f"only slow to reach its first step (preparing data, compiling), raise {neutral('timeout')}",
            )
        self.emit(self._failed(error))

    # -- the outcome ------------------------------------------------------------------------------

    def raised(self, exc: BaseException, caught: bool = False) -> ProbeOutcome:
        """The script raised ``exc`` (out of its ``__main__``, or seen by :class:`OomWatch`)."""
        used = _safe(self.device.peak)
        kind = classify_exception(exc, used_bytes=used, budget_bytes=self.request.budget_bytes)
        if kind != "oom":
            return self._failed(exc)
        describe_failure(self.outcome, exc, kind="oom")
        if caught:
            self.outcome.reason = (
                f"the script raised an out-of-memory error after {self.report.steps} optimizer step(s) "
                f"({type(exc).__name__}); the probe ends where it is raised, whether or not the script would catch "
                "it: a batch the script survives only by catching it (retrying smaller, skipping a batch) does not fit"
            )
        return self._measured(fits=False)

    def ended(self, name: str, code: object) -> ProbeOutcome:
        """The script ended on its own before its steps were enough."""
        status = f"exit code {code}" if code not in (0, None) else "exit code 0"
        steps = self.report.steps
        if steps == 0:
            error = ContractError(
                f"{name} ended ({status}) before its first optimizer step at batch {self.request.batch_size}",
                hint="a script run as it is must reach torch.optim's optimizer.step() with the arguments after --: "
                "check that they run the training loop (its last lines are shown), and that its optimizer is a "
                "torch.optim.Optimizer",
            )
        else:
            error = self._out_of_steps(f"{name} ended ({status}) after {steps} optimizer step(s)")
        return self._failed(error)

    def _out_of_steps(self, ended: str) -> ContractError:
        """The error of a script that ``ended`` before its steps were enough: a batch above its DataLoader's
        dataset (each epoch one batch of it: the data, not memory, is the limit), else too little data."""
        batch, needed, most = self.request.batch_size, max(self.request.min_steps, 2), self.request.max_steps
        held = self.loaders.smaller_than(batch)
        if held is not None:
            return ContractError(
                f"{ended} at batch {batch}: its DataLoader holds {held} samples, fewer than the batch, so each epoch "
                f"was one batch of {held} (a batch above {held} is {held} in this job; a probe needs {needed} steps "
                f"at least, up to {most}); {NOTHING_OF_MEMORY}",
                hint=f"tune with {neutral('max_batch_size', held)}, and give the script epochs for {most} steps at a batch of "
                f"{held} in its arguments after -- (or more data)",
            )
        return ContractError(
            f"{ended} at batch {batch}: not enough data at this batch size, or a number of steps of its own (a "
            f"--steps or --max-steps argument) that holds at every batch size (a probe needs {needed} at least, and "
            f"more while the peak still grows, up to {most}); {NOTHING_OF_MEMORY}",
            hint=f"give the script at least {most} steps for the tune: more steps, data or epochs in the arguments "
            "after -- (the probe ends the script once it has measured what it needs)",
        )

    def _failed(self, exc: BaseException) -> ProbeOutcome:
        describe_failure(self.outcome, exc)
        return self._measured(fits=False)

    def _measured(self, fits: bool = True) -> ProbeOutcome:
        """The outcome with what the steps measured (and, on CUDA, its verdict)."""
        outcome = self.outcome
        signal.setitimer(signal.ITIMER_REAL, 0)
        outcome.peak_bytes = _safe(self.device.peak)
        self.report.optimizer_state_bytes = sum(_state_bytes(o) for o in self.optimizers.values())
        params = {id(p): p for o in self.optimizers.values() for g in o.param_groups for p in g["params"]}
        self.report.param_count = sum(p.numel() for p in params.values())
        self.report.param_bytes = _tensor_bytes(params.values())
        self.device.finish(outcome)
        if fits and self.report.stopped_above:
            _stopped_at_line(outcome, self.report.steps, self.request)
        _read_report(outcome, self.report)
        micro = accumulation(self.backwards.laps)
        notes = self.late.notes(sys._getframe())  # memory the probe could not see
        if micro > 1:  # the script accumulates gradients itself: each step is that many micro-batches
            outcome.info["micro_batches_per_step"] = micro
            notes.insert(0, accumulation_note(micro))
            if outcome.samples_per_second is not None:
                outcome.samples_per_second *= micro
        if notes:
            outcome.info["script_notes"] = notes
        children = _children()
        if children and self.request.device == "cpu":
            own = _children_own_bytes()
            outcome.info["child_processes"] = children
            if own is not None:
                outcome.info["child_own_bytes"] = own
            outcome.info["note"] = not_counted_note(children, own)
        return outcome


class LoaderSizes:
    """The sizes of the datasets the script's data loaders batch (a wrapper around
    ``DataLoader.__init__``): a batch larger than its dataset is the dataset, one batch an epoch, which a script
    that ran out of steps at a large batch is told (:meth:`StepWatch.ended`)."""

    def __init__(self) -> None:
        self.built: list[tuple[int, int]] = []  # (batch_size, len(dataset)) of each map-style loader built

    def install(self) -> None:
        from torch.utils.data import DataLoader

        built, init = self.built, DataLoader.__init__

        def noted(loader: Any, dataset: Any, *args: Any, **kwargs: Any) -> None:
            init(loader, dataset, *args, **kwargs)
            try:
                if loader.batch_size is not None and not loader.drop_last:
                    built.append((int(loader.batch_size), len(dataset)))
            except TypeError:  # an iterable dataset has no length: nothing to say
                pass

        DataLoader.__init__ = noted  # type: ignore[method-assign,assignment]

    def smaller_than(self, batch_size: int) -> int | None:
        """The size of a dataset a loader of ``batch_size`` batches that is smaller than the batch (None: none)."""
        return next((size for batch, size in self.built if batch == batch_size and 0 < size < batch), None)


class BackwardCount:
    """Counts the backward passes of the probe (``torch.autograd.backward``, which ``Tensor.backward``
    calls) between the steps that count: more than one per step is the script's own gradient accumulation."""

    def __init__(self, after: Callable[[], None]) -> None:
        self.count = 0
        self.laps: list[int] = []  # backward passes before each counted step; -1: another optimizer stepped
        self.after = after  # called after each backward pass

    def install(self) -> None:
        import torch.autograd

        original = torch.autograd.backward

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            result = original(*args, **kwargs)
            self.after()
            return result

        torch.autograd.backward = counted  # type: ignore[assignment]

    def lap(self, optimizers: int) -> None:
        self.laps.append(self.count if optimizers == 1 else -1)  # two optimizers (a GAN): not accumulation
        self.count = 0


class OomWatch:
    """Sees an out-of-memory error where it is raised, in every Python thread of the probe, even when the
    script catches it: a trace function on the frames' ``exception`` events only (no line events)."""

    def __init__(self, steps: StepWatch) -> None:
        self.steps = steps

    def install(self) -> None:
        sys.settrace(self._call)
        threading.settrace(self._call)

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_lines = False
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "exception" and isinstance(arg[1], _OOM_TYPES):
            exc = arg[1]
            used = _safe(self.steps.device.peak)
            budget = self.steps.request.budget_bytes
            if (
                not self.steps.reported
                and classify_exception(exc, used_bytes=used, budget_bytes=budget) == "oom"
            ):
                sys.settrace(None)
                self.steps.emit(self.steps.raised(exc, caught=True))
        return self._local


def _state_bytes(optimizer: Any) -> int:
    from autobatch.step.optimizers import optimizer_state_bytes

    return optimizer_state_bytes(optimizer)


def _tensor_bytes(tensors: Any) -> int:
    return sum(int(t.numel() * t.element_size()) for t in tensors)


def _children() -> int:
    import psutil

    try:
        return len(psutil.Process().children(recursive=True))
    except psutil.Error:
        return 0


def _children_own_bytes() -> int | None:
    """The memory the script's processes hold that no other process shares (their unique set sizes, read from
    ``/proc/PID/smaps_rollup``), summed; None when none could be read."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return None
    sizes = []
    for child in children:
        try:
            sizes.append(int(child.memory_full_info().uss))
        except (psutil.Error, OSError):
            continue
    return sum(sizes) if sizes else None


def _safe(fn: Callable[[], int]) -> int | None:
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None
