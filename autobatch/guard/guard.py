"""The runtime guard: run each per-rank batch as micro-batches, and survive running out of memory.

:class:`Guard` splits a batch along its first dimension into micro-batches of the current size, weights
each micro-batch's loss by its share of the samples and runs its backward. When the device runs out of
memory (classified as tunes classify it, :mod:`autobatch.probe.oom`), it drops the partial gradients and
the allocator's cache, lowers the size one rung (:mod:`autobatch.core.ladder`) and runs the same batch
again; the optimizer steps once per batch. Every rank agrees on the outcome before any rank goes on
(:mod:`autobatch.guard.ranks`). A guard built from a tune's result records the run's end under that result's
cache key (:class:`autobatch.guard.events.EvidenceRecorder`) and warns once when the run's peak nears the
tune's budget. How a batch is read and split: :mod:`autobatch.guard.batches`. Usage, the rank design and its
limits: docs/guard.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autobatch.core.ladder import Ladder, LadderSettings, Move, after_step, lower, rungs
from autobatch.devices.budget import EarlyWarning
from autobatch.errors import GuardError, UsageError
from autobatch.guard.batches import bounds, samples, shapes, split
from autobatch.guard.events import (
    EventLog,
    Evidence,
    EvidenceRecorder,
    GuardEvent,
    GuardSummary,
    PeakMeter,
    logger,
)
from autobatch.guard.ranks import (
    Group,
    PeerRanOut,
    agree,
    average_gradients,
    broadcast_buffers,
    check_fsdp,
    current_group,
    is_ddp,
    is_fsdp,
    reset_fsdp,
)
from autobatch.probe.oom import classify_exception

if TYPE_CHECKING:
    import torch

    from autobatch.records.result import TuneResult

#: Seconds between two readings of the peak for the early warning (a high-water mark: nothing is missed).
PEAK_CHECK_SECONDS = 1.0

#: ``loss_fn(model, micro_batch)``: the micro-batch's loss, a mean over its samples (or over what
#: ``weight`` counts).
LossFn = Callable[[Any, Any], "torch.Tensor"]

#: BatchNorm's refusal of a micro-batch of 1 sample in training (``torch.nn.functional.batch_norm``'s ValueError).
ONE_SAMPLE_REFUSED = "Expected more than 1 value per channel when training"

#: A testing aid: the batches (0-based, comma-separated) whose first attempt runs out of memory for real.
FAIL_AT_ENV = "AUTOBATCH_GUARD_FAIL_AT"


@dataclass(frozen=True)
class GuardStep:
    """One global batch as the guard ran it."""

    step: int  # 0-based
    loss_tensor: Any  # the batch's loss (detached, on the device): the micro-batches' losses by their shares
    samples: int  # samples in this rank's batch (all of them ran, once)
    micro_batch_size: int  # the size it completed at
    micro_batches: int
    attempts: int  # 1, or more when it ran out of memory and ran again

    @property
    def loss(self) -> float:
        """The batch's loss as a number (read when asked: on CUDA a read waits for the device)."""
        return float(self.loss_tensor)


class Guard:
    """Keeps a job's batch when memory runs out: splits it finer, agrees with the other ranks, grows back.

    ``micro_batch_size`` is where it starts; it may grow back up to ``max_micro_batch_size`` (default: the
    start) and lower down to 1 through ``sizes`` (the tuned curve's sizes that fitted; halvings below them).
    ``batch_size`` is the per-rank batch the plan expects (informational: the guard splits whatever batch it
    is given). ``events``: a JSON Lines file for the changes (``{rank}`` in it: one file per rank; else
    rank 0 writes it). ``fail_at``: batches whose first attempt runs out of memory, a testing aid (default:
    ``AUTOBATCH_GUARD_FAIL_AT``; docs/guard.md).
    ``evidence``: the tuned key the run's end is recorded under in the cache, and the tune's
    budget the early warning watches (:meth:`from_result` fills it in; None: nothing recorded)."""

    def __init__(
        self,
        micro_batch_size: int,
        *,
        batch_size: int | None = None,
        max_micro_batch_size: int | None = None,
        sizes: Iterable[int] = (),
        settings: LadderSettings | None = None,
        events: str | Path | None = None,
        fail_at: Iterable[int] | None = None,
        evidence: Evidence | None = None,
    ) -> None:
        maximum = max_micro_batch_size if max_micro_batch_size is not None else micro_batch_size
        if micro_batch_size < 1 or maximum < micro_batch_size:
            raise UsageError(
                f"the guard needs 1 <= micro_batch_size <= max_micro_batch_size, got {micro_batch_size} and {maximum}",
                hint="pass the plan's micro-batch and the tuned maximum (or Guard.from_result)",
            )
        self.batch_size = batch_size
        self.ladder = Ladder.start(rungs(sizes, maximum), micro_batch_size, settings)
        self.events_path = events
        self.fail_at = frozenset(fail_at) if fail_at is not None else fail_at_from_env()
        self.evidence = evidence
        self.summary = GuardSummary(
            start_micro_batch_size=micro_batch_size,
            micro_batch_size=micro_batch_size,
            smallest_micro_batch_size=micro_batch_size,
        )
        self.last: GuardStep | None = None
        self._group: Group | None = None
        self._meter: PeakMeter | None = None
        self._log: EventLog | None = None
        self._recorder: EvidenceRecorder | None = None
        self._model: torch.nn.Module | None = None
        self._fsdp = self._ddp = False
        self._running: tuple[torch.Tensor, ...] = ()  # BatchNorm's running statistics in the model
        self._warning: EarlyWarning | None = None
        self._checked = 0.0
        self._retries = 0  # the allocator's retries when last read

    @classmethod
    def from_result(
        cls,
        result: str | Path | TuneResult,
        *,
        settings: LadderSettings | None = None,
        events: str | Path | None = None,
    ) -> Guard:
        """A guard for a tune's chosen plan: its micro-batch, its per-rank batch (micro-batch x accumulation),
        the combination's maximum, and the sizes its probes saw fit. The run's evidence goes under the result's
        cache key (a result kept in or served from the cache names it; none: nothing is recorded)."""
        from autobatch.records.result import TuneResult

        tuned = result if isinstance(result, TuneResult) else TuneResult.load(result)
        chosen = tuned.chosen
        if chosen is None:
            raise UsageError(
                f"the result of {tuned.script} has no chosen plan",
                hint="tune until a combination fits (or give Guard its sizes directly)",
            )
        combo = next((c for c in tuned.combinations if c.ident == chosen.ident), None)
        fitted = [p.batch_size for p in combo.trace if p.kind == "fits"] if combo is not None else []
        maximum = (combo.max_batch_size if combo is not None else None) or chosen.micro_batch_size
        cache = tuned.cache or {}
        folder = cache.get("folder")
        evidence = (
            Evidence(
                str(cache["key"]),
                cache_dir=folder if folder and Path(folder).is_dir() else None,
                tuned_peak_bytes=tuned.tuned_peak(chosen.micro_batch_size),
                budget_bytes=tuned.device.get("budget_bytes"),
                accumulation_steps=chosen.accumulation_steps,
                world_size=chosen.world_size,
            )
            if cache.get("key")
            else None
        )
        if evidence is None:
            logger.info(
                "guard: the result names no cache key (tuned with --no-cache?): no runtime evidence is kept"
            )
        return cls(
            chosen.micro_batch_size,
            batch_size=chosen.micro_batch_size * chosen.accumulation_steps,
            max_micro_batch_size=max(maximum, chosen.micro_batch_size),
            sizes=fitted,
            settings=settings,
            events=events,
            evidence=evidence,
        )

    @property
    def micro_batch_size(self) -> int:
        """The size the next batch starts at."""
        return self.ladder.size

    def backward(
        self,
        model: torch.nn.Module,
        batch: Any,
        loss_fn: LossFn,
        *,
        weight: Callable[[Any], float] | None = None,
        scaler: Any = None,
    ) -> torch.Tensor:
        """Run one per-rank batch's forward and backward as micro-batches, surviving out-of-memory failures;
        return its loss (detached). The optimizer step is the caller's (a ``training_step`` returns this).

        Gradients already there on entry (another batch before the optimizer steps) are set aside while the
        batch runs and added back after it, so that a failure drops only this batch's (under FSDP2 they must be
        empty: ``zero_grad(set_to_none=True)``). ``weight(micro_batch)``: what a micro-batch's share counts (default: its samples; give
        the loss's token count when the loss is a mean over tokens). ``scaler``: a ``GradScaler`` for fp16."""
        group = self._start(model)
        if self._model is not model:  # what the model is, looked at once (a walk over its modules)
            self._model, self._fsdp, self._ddp = model, is_fsdp(model), is_ddp(model)
            self._running = running_statistics(model)
            if self._fsdp:
                check_fsdp(group, model)
        ddp, fsdp = self._ddp, self._fsdp
        samples(batch)  # a batch whose parts disagree is refused before anything is set aside
        before = Before.take(model, self._running, self._meter_(), keep_grads=not fsdp)
        attempts = 0
        while True:
            attempts += 1
            if attempts > 1:
                before.restore()
            failure = None
            loss = None
            inject = attempts == 1 and self.summary.steps in self.fail_at
            agreed: tuple[bool, bool] | None = None
            try:
                loss, count = self._run(model, batch, loss_fn, weight, scaler, ddp, inject)
            except PeerRanOut:
                agreed = (True, False)  # the check's all-reduce was this rank's agreement
            except Exception as exc:  # noqa: BLE001 - only an out-of-memory failure is caught; the rest re-raised
                if classify_exception(exc) != "oom":
                    raise
                failure = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            retries = self._meter_().alloc_retries()  # one read per attempt: CUDA's stats are a dictionary
            retried, self._retries = retries > self._retries, retries
            ran_out, retried = agreed or agree(group, failure is not None, retried)
            if not ran_out:
                assert loss is not None
                if ddp and group.distributed:
                    average_gradients(group, model)
                    if getattr(model, "broadcast_buffers", False):
                        broadcast_buffers(model)
                before.add_grads()
                self._completed(batch, loss, count, attempts, retried)
                return loss
            del loss
            if fsdp:
                reset_fsdp(model)
            self._recover(model, batch, failure, group)

    def step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        batch: Any,
        loss_fn: LossFn,
        *,
        weight: Callable[[Any], float] | None = None,
        scaler: Any = None,
    ) -> GuardStep:
        """One global batch of a plain loop: :meth:`backward`, then one step and ``zero_grad`` of the optimizer,
        or of each of several over one model's parameter groups (AdamW for the matrices and another for the
        rest, say); with ``scaler``, ``scaler.step`` of each and one ``scaler.update``, as PyTorch's AMP recipe
        for several optimizers does. Checked before the batch runs: an optimizer is a thing that steps."""
        optimizers = _optimizers(optimizer)
        self.backward(model, batch, loss_fn, weight=weight, scaler=scaler)
        for each in optimizers:
            if scaler is not None:
                scaler.step(each)
            else:
                each.step()
        if scaler is not None:
            scaler.update()
        for each in optimizers:
            each.zero_grad(set_to_none=True)
        assert self.last is not None
        return self.last

    def state_dict(self) -> dict[str, Any]:
        """Where the guard stands, for a checkpoint (plain JSON-able values): the batches it completed, its
        micro-batch, the ceiling it may grow to and its counts. :meth:`load_state_dict` takes it back."""
        return {
            "steps": self.summary.steps,
            "smallest_micro_batch_size": self.summary.smallest_micro_batch_size,
            **self.ladder.state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a checkpoint's :meth:`state_dict`: the next batch is numbered after the checkpoint's
        (events, evidence, ``AUTOBATCH_GUARD_FAIL_AT``) and runs at the micro-batch the guard had reached,
        with the sizes that ran out still counted against."""
        try:
            self.ladder = self.ladder.resumed(state)
            steps = int(state["steps"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(
                f"the guard's state is not one Guard.state_dict() wrote ({type(exc).__name__}: {exc})",
                hint="save guard.state_dict() in the checkpoint and give it back as it was",
            ) from None
        self.summary.steps = steps
        self.summary.micro_batch_size = self.ladder.size
        smallest = int(state.get("smallest_micro_batch_size", self.ladder.size))
        self.summary.smallest_micro_batch_size = min(smallest, self.ladder.size)

    def summary_now(self) -> GuardSummary:
        """The summary with the peak read now."""
        self.summary.peak_bytes = self._meter_().peak() if self._meter is not None else None
        return self.summary

    def close(self) -> GuardSummary:
        """Read the run's peak, write the summary line to the events file and close it, and record the run's
        evidence under its tuned key (once: a :class:`GuardError` already recorded it)."""
        return self._finish("exit")

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, GuardError):
            self.close()
        else:  # the script's own error ended the run
            self._finish(
                "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            )

    def _finish(self, outcome: str, reason: str = "", shapes: list[list[int]] | None = None) -> GuardSummary:
        summary = self.summary_now()
        if self._warning is not None:
            self._warning.check(summary.peak_bytes)
        if self._log is not None:
            self._log.close(summary)
        if self._recorder is not None:
            self._recorder.record(summary, outcome, reason, shapes)
        return summary

    # --- inside ---------------------------------------------------------------------------------------

    def _start(self, model: torch.nn.Module) -> Group:
        if self._group is None:
            self._group = current_group()
            device = next((p.device for p in model.parameters()), None)
            kind = device.type if device is not None else "cpu"
            self._meter = PeakMeter(kind, device.index if device is not None and kind == "cuda" else None)
            self._retries = self._meter.alloc_retries()
            self._log = EventLog(self.events_path, self._group.rank)
            if self.evidence is not None:
                self._recorder = EvidenceRecorder(self.evidence, self._group.rank, kind)
                if self.evidence.budget_bytes:
                    self._warning = EarlyWarning(kind, self.evidence.budget_bytes, _warn)
        return self._group

    def _meter_(self) -> PeakMeter:
        assert self._meter is not None
        return self._meter

    def _run(
        self,
        model: torch.nn.Module,
        batch: Any,
        loss_fn: LossFn,
        weight: Callable[[Any], float] | None,
        scaler: Any,
        ddp: bool,
        inject: bool,
    ) -> tuple[torch.Tensor, int]:
        n, size = samples(batch), self.ladder.size
        cuts = bounds(n, size)
        # one micro-batch is the batch as it is, not a slice of it
        parts = [batch] if len(cuts) == 1 else list(split(batch, size, n))
        if weight is not None:
            shares = [float(weight(part)) for part in parts]
        else:
            shares = [float(stop - start) for start, stop in cuts]
        whole = sum(shares)
        total: torch.Tensor | None = None
        with model.no_sync() if ddp else nullcontext():  # type: ignore[operator]
            for part, share, (start, stop) in zip(parts, shares, cuts, strict=True):
                if inject:
                    inject = False
                    run_out_of_memory(next(model.parameters()).device)
                if not share and whole and not self._fsdp:
                    # it counts for nothing, and its loss may be 0/0 (a token mean without tokens), whose
                    # backward times 0 is NaN; under FSDP every rank must run every micro-batch's collectives
                    continue
                try:
                    loss = loss_fn(model, part)
                except ValueError as exc:
                    if stop - start == 1 and ONE_SAMPLE_REFUSED in str(exc):
                        raise self._refused_one_sample(batch, n, size, exc) from exc
                    raise
                if len(parts) == 1 and whole:
                    scaled = loss  # the whole batch's share is 1
                else:
                    scaled = loss * (share / whole) if whole else loss * 0
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
                total = scaled.detach() if total is None else total + scaled.detach()
                del loss, scaled
        assert total is not None
        return total, len(parts)

    def _completed(self, batch: Any, loss: torch.Tensor, count: int, attempts: int, retried: bool) -> None:
        step = self.summary.steps
        self.last = GuardStep(step, loss, samples(batch), self.ladder.size, count, attempts)
        self.summary.steps += 1
        self.ladder, move = after_step(self.ladder, retried)
        if move is not None:
            self._record(move, batch, step)
        # at most once a second: the early warning, and the events file's summary so far (which a job that a
        # signal ends keeps)
        keeping = self._log is not None and self._log.handle is not None
        warning = self._warning is not None and not self._warning.warned
        if keeping or warning:
            now = time.monotonic()
            if now - self._checked >= PEAK_CHECK_SECONDS:
                self._checked = now
                summary = self.summary_now()
                if warning:
                    assert self._warning is not None
                    self._warning.check(summary.peak_bytes)
                if keeping:
                    assert self._log is not None
                    self._log.summary(summary)

    def _recover(self, model: torch.nn.Module, batch: Any, failure: str | None, group: Group) -> None:
        for parameter in model.parameters():
            parameter.grad = None
        self._release()
        lowered = lower(self.ladder)
        if lowered is None:
            where = f"on rank {group.rank}" if failure is not None else "on another rank"
            self._finish("oom", failure or "another rank ran out of memory", shapes(batch))
            raise GuardError(
                f"batch {self.summary.steps} ({samples(batch)} samples, shapes {shapes(batch)}) ran out of memory "
                f"{where} even one sample at a time" + (f" ({failure})" if failure else ""),
                hint="shorten or bucket its longest samples, or make each sample cheaper (bf16, recomputation); "
                "`autobatch tune` at its lengths says what fits",
                step=self.summary.steps,
                shapes=shapes(batch),
            )
        self.ladder, move = lowered
        self.summary.out_of_memory += 1  # handled: the batch runs again (a failure at 1 is the GuardError's)
        self._record(move, batch, self.summary.steps, ran_out=failure is not None)

    def _refused_one_sample(self, batch: Any, n: int, size: int, exc: ValueError) -> GuardError:
        """The error for a model that refused a micro-batch of 1 sample (BatchNorm in training), saying why the
        batch had one and what to change; the run's end is recorded with it."""
        if n == 1:
            why = "the batch itself is one sample"
            fix = "drop a last batch that short (DataLoader(..., drop_last=True))"
        elif size == 1:
            why = "the guard had lowered the micro-batch to 1, as 2 samples ran out of memory"
            fix = (
                "replace BatchNorm with a norm of each sample alone (GroupNorm, LayerNorm), or make 2 samples fit "
                "(shorten or bucket the longest samples, bf16, recomputation)"
            )
        else:
            why = f"{n} samples at most {size} a micro-batch cannot be split without one of 1"
            fix = (
                "give batches that split into parts of 2 or more at the guard's sizes (an even per-rank batch), "
                "or replace BatchNorm with a norm of each sample alone (GroupNorm, LayerNorm)"
            )
        error = GuardError(
            f"batch {self.summary.steps} ({n} samples, shapes {shapes(batch)}) ran a micro-batch of 1 sample, "
            f"which the model refuses in training ({str(exc).splitlines()[0][:200]}): {why}",
            hint=f"BatchNorm cannot normalise one sample: {fix}",
            step=self.summary.steps,
            shapes=shapes(batch),
        )
        self._finish("error", error.message, error.shapes)
        return error

    def _release(self) -> None:
        meter = self._meter_()
        if meter.device_type == "cuda":
            import gc

            import torch

            gc.collect()
            torch.cuda.empty_cache()
        else:
            from autobatch.devices.cpu import release_heap

            release_heap()

    def _record(self, move: Move, batch: Any, step: int, ran_out: bool = False) -> None:
        assert self._log is not None and self._group is not None
        event = GuardEvent(
            step=step,
            old=move.old,
            new=move.new,
            reason=move.reason,
            peak_bytes=self._meter_().peak(),
            rank=self._group.rank,
            samples=samples(batch),
            shapes=shapes(batch),
            ran_out=ran_out,
        )
        self.summary.events.append(event)
        self.summary.micro_batch_size = move.new
        self.summary.smallest_micro_batch_size = min(self.summary.smallest_micro_batch_size, move.new)
        self.summary.peak_bytes = event.peak_bytes
        self._log.event(event)
        self._log.summary(self.summary)
        if self._recorder is not None:
            self._recorder.change(event)


@dataclass(frozen=True)
class Before:
    """What a batch changes, as it was before the batch: the device's random state (dropout's masks),
    BatchNorm's running statistics, and the gradients already there (set aside, out of reach of a failure's
    clearing). A batch run again after an out-of-memory failure starts from it, as if the failed attempt never
    ran: the same masks, the statistics moved once; the gradients set aside are added back when it completes."""

    rng: Any
    device_rng: Any  # CUDA's generator of the model's device (None on the CPU)
    device_index: int | None
    buffers: tuple[tuple[Any, Any], ...]  # (buffer, its copy)
    grads: tuple[tuple[Any, Any], ...]  # (parameter, its gradient before the batch)

    @classmethod
    def take(
        cls, model: torch.nn.Module, running: tuple[torch.Tensor, ...], meter: PeakMeter, keep_grads: bool
    ) -> Before:
        """Now, for a model whose running statistics are ``running`` (:func:`running_statistics`); with
        ``keep_grads``, the model's gradients are set aside (each parameter's ``grad`` is None after)."""
        import torch

        grads = tuple((p, p.grad) for p in model.parameters() if p.grad is not None) if keep_grads else ()
        for parameter, _ in grads:
            parameter.grad = None
        return cls(
            torch.get_rng_state(),
            torch.cuda.get_rng_state(meter.device_index or 0) if meter.device_type == "cuda" else None,
            meter.device_index,
            tuple((buffer, buffer.detach().clone()) for buffer in running),
            grads,
        )

    def add_grads(self) -> None:
        """Add the gradients set aside to the batch's (in place, into the tensors that were there)."""
        for parameter, grad in self.grads:
            if parameter.grad is not None:
                grad.add_(parameter.grad)
            parameter.grad = grad

    def restore(self) -> None:
        import torch

        torch.set_rng_state(self.rng)
        if self.device_rng is not None:
            torch.cuda.set_rng_state(self.device_rng, self.device_index or 0)
        with torch.no_grad():
            for buffer, copy in self.buffers:
                buffer.copy_(copy)


def running_statistics(model: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    """The running statistics of the model's BatchNorm layers (what a training forward updates in place)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return tuple(
        buffer
        for module in model.modules()
        if isinstance(module, _BatchNorm) and module.track_running_stats
        for buffer in (module.running_mean, module.running_var, module.num_batches_tracked)
        if buffer is not None
    )


def fail_at_from_env() -> frozenset[int]:
    """The batches ``AUTOBATCH_GUARD_FAIL_AT`` names (``"3"`` or ``"3,40"``; unset or empty: none)."""
    text = os.environ.get(FAIL_AT_ENV, "").strip()
    try:
        steps = frozenset(int(part) for part in text.split(",") if part.strip()) if text else frozenset()
    except ValueError:
        steps = frozenset({-1})
    if any(step < 0 for step in steps):
        raise UsageError(
            f"{FAIL_AT_ENV}={text!r} is not a list of batch numbers",
            hint=f"write 0-based batch numbers separated by commas ({FAIL_AT_ENV}=3,40), or unset it",
        )
    return steps


def run_out_of_memory(device: torch.device) -> None:
    """Ask the device's allocator for a petabyte: it fails with its own out-of-memory error (the test hook)."""
    import torch

    torch.empty(1 << 50, dtype=torch.uint8, device=device)


def _warn(message: str) -> None:
    logger.warning("guard: %s", message)


__all__ = ["Guard", "GuardStep", "LossFn"]


def _optimizers(given: Any) -> list[Any]:
    """The optimizers :meth:`Guard.step` steps: one, or each of a list or tuple of them; anything without
    ``step`` and ``zero_grad`` is refused before the batch runs (a dict of them, say)."""
    optimizers = list(given) if isinstance(given, (list, tuple)) else [given]
    wrong = [
        o
        for o in optimizers
        if not (callable(getattr(o, "step", None)) and callable(getattr(o, "zero_grad", None)))
    ]
    if not optimizers or wrong:
        what = type(wrong[0]).__name__ if wrong else "an empty list"
        raise UsageError(
            f"guard.step takes an optimizer or a list of them, and got {what}",
            hint="pass the optimizer (guard.step(model, optimizer, batch, loss_fn)), or a list of the optimizers "
            "that step together ([adamw, sgd]); a loop that steps them itself calls guard.backward",
        )
    return optimizers
