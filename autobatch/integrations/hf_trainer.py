"""Hugging Face ``Trainer`` with the runtime guard: :class:`GuardedTrainer`.

The Trainer's loop stays as it is (data, logging, evaluation, checkpoints, the optimizer step); only
``training_step`` changes: the guard runs the per-device batch as micro-batches and lowers them when memory
runs out (:mod:`autobatch.guard`). The Trainer's own accumulation must be 1, so that its per-device batch is
the plan's per-rank batch and the guard owns the split. Usage and limits: docs/guard.md.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Trainer

from autobatch.errors import UsageError
from autobatch.guard import Guard
from autobatch.guard.guard import samples


class GuardedTrainer(Trainer):
    """A ``Trainer`` whose ``training_step`` runs each per-device batch through ``guard``.

    ``args.per_device_train_batch_size`` is the per-rank batch (micro-batch x accumulation of the plan, as
    ``apply_to_training_arguments(result, args, guard=True)`` sets it) and ``args.gradient_accumulation_steps``
    must be 1. When the Trainer would count ``num_items_in_batch`` (labels, and a model that takes loss
    keywords or a ``compute_loss_func``), each micro-batch's loss is divided by its own count and weighted by
    it, so the gradient is the Trainer's mean over the batch's tokens whatever the split; otherwise each
    micro-batch's loss is weighted by its samples.
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

    def _items(self, micro: dict[str, Any]) -> torch.Tensor:
        """The micro-batch's labels that count, as the Trainer counts ``num_items_in_batch``."""
        if "shift_labels" in micro:
            labels = micro["shift_labels"]
        elif getattr(self, "_loss_shifts_labels", False):
            labels = micro["labels"][..., 1:]
        else:
            labels = micro["labels"]
        return labels.ne(-100).sum()
