"""Hugging Face ``Trainer`` with the runtime guard: :class:`GuardedTrainer`.

The Trainer's loop stays as it is (data, logging, evaluation, checkpoints, the optimizer step); only
``training_step`` changes: the guard runs the per-device batch as micro-batches and lowers them when memory
runs out (:mod:`autobatch.guard`). The Trainer's own accumulation must be 1, so that its per-device batch is
the plan's per-rank batch and the guard owns the split. The guard's state goes into each checkpoint beside the
optimizer's, and comes back with it on ``resume_from_checkpoint``. Usage and limits: docs/guard.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer

from autobatch.errors import UsageError
from autobatch.guard import Guard
from autobatch.guard.batches import samples

#: The guard's state in a Trainer checkpoint's folder (:meth:`autobatch.Guard.state_dict`, as JSON).
GUARD_STATE_NAME = "autobatch_guard.json"


class GuardedTrainer(Trainer):
    """A ``Trainer`` whose ``training_step`` runs each per-device batch through ``guard``.

    ``args.per_device_train_batch_size`` is the per-rank batch (micro-batch x accumulation of the plan, as
    ``apply_to_training_arguments(result, args, guard=True)`` sets it) and ``args.gradient_accumulation_steps``
    must be 1. When the Trainer would count ``num_items_in_batch`` (labels, and a model that takes loss
    keywords or a ``compute_loss_func``), each micro-batch's loss is divided by its own count and weighted by
    it, so the gradient is the Trainer's mean over the batch's tokens whatever the split; otherwise each
    micro-batch's loss is weighted by its samples.

    A checkpoint holds the guard's state (:data:`GUARD_STATE_NAME`) where the Trainer saves the optimizer's, and
    ``train(resume_from_checkpoint=...)`` gives it back where the Trainer loads the optimizer's: the resumed run
    goes on at the micro-batch the guard had reached, numbering its batches after the checkpoint's.
    """

    def __init__(self, *args: Any, guard: Guard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        problems = []
        if self.args.gradient_accumulation_steps != 1:
            problems.append(f"gradient_accumulation_steps is {self.args.gradient_accumulation_steps}, not 1")
        if guard.batch_size is not None and self.args.per_device_train_batch_size != guard.batch_size:
            problems.append(
                f"per_device_train_batch_size is {self.args.per_device_train_batch_size}, "
                f"not the plan's per-rank batch {guard.batch_size}"
            )
        if self.args.n_gpu > 1:
            problems.append(f"it runs {self.args.n_gpu} GPUs in one process (DataParallel)")
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            problems.append("DeepSpeed and FSDP run their own backward, which the guard cannot split")
        if problems:
            raise UsageError(
                "GuardedTrainer: " + "; ".join(problems),
                hint="the guard owns the split: set per_device_train_batch_size to micro-batch x accumulation "
                "and gradient_accumulation_steps=1 (apply_to_training_arguments(result, args, guard=True))",
            )
        self.guard = guard

    def training_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """The per-device batch's forward and backward as micro-batches. ``num_items_in_batch`` (the whole
        batch's count) is not used: each micro-batch's loss is divided by its own count and weighted by it."""
        model.train()
        train = getattr(self.optimizer, "train", None)
        if callable(train):  # schedule-free optimizers
            train()
        inputs = self._prepare_inputs(inputs)
        # (getattr: attributes of recent transformers; older ones count no items)
        counted = "labels" in inputs and bool(
            getattr(self, "model_accepts_loss_kwargs", False) or getattr(self, "compute_loss_func", None)
        )
        # compute_loss multiplies a counted loss by the ranks when averaging tokens across devices; the guard
        # averages the ranks' gradients itself
        ranks = self.accelerator.num_processes // getattr(self, "get_tp_size", lambda: 1)()
        undo = ranks if counted and getattr(self.args, "average_tokens_across_devices", False) else 1

        def loss_fn(model: torch.nn.Module, micro: dict[str, Any]) -> torch.Tensor:
            items = self._items(micro).clamp(min=1) if counted else None  # no labels: a zero loss, weight 0
            with self.compute_loss_context_manager():
                loss = self.compute_loss(model, micro, num_items_in_batch=items)
            assert isinstance(loss, torch.Tensor)
            return loss / undo if undo != 1 else loss

        def weight(micro: dict[str, Any]) -> float:
            return float(self._items(micro)) if counted else float(samples(micro))

        return self.guard.backward(
            model, inputs, loss_fn, weight=weight, scaler=getattr(self.accelerator, "scaler", None)
        )

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The Trainer's optimizer and scheduler, and the guard's state beside them (once, by the process that
        saves; every rank's guard stands at the same place)."""
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            Path(output_dir, GUARD_STATE_NAME).write_text(
                json.dumps(self.guard.state_dict()), encoding="utf-8"
            )

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """The Trainer's optimizer and scheduler, and the guard's state when the checkpoint holds it (one written
        before GuardedTrainer kept it does not: the guard starts afresh)."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and Path(checkpoint, GUARD_STATE_NAME).is_file():
            self.guard.load_state_dict(
                json.loads(Path(checkpoint, GUARD_STATE_NAME).read_text(encoding="utf-8"))
            )

    def _items(self, micro: dict[str, Any]) -> torch.Tensor:
        """The micro-batch's labels that count, as the Trainer counts ``num_items_in_batch``."""
        if "shift_labels" in micro:
            labels = micro["shift_labels"]
        elif getattr(self, "_loss_shifts_labels", False):
            labels = micro["labels"][..., 1:]
        else:
            labels = micro["labels"]
        return labels.ne(-100).sum()
