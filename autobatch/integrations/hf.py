"""Hugging Face, for training with a result: :func:`apply_to_training_arguments`.

(The adapter that builds a model from its config for ``tune --hf`` is :mod:`autobatch.step.hf`.)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autobatch.records.result import TuneResult


def apply_to_training_arguments(
    result: TuneResult | str | Path, args: Any, *, allow_cpu: bool = False, guard: bool = False
) -> Any:
    """``args`` (a ``TrainingArguments``) with a tune result applied, as a new object.

    Sets ``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``bf16``/``fp16``, ``optim``
    (and ``optim_args``) as the installed transformers spells them, recomputation under the key the
    installed version reads (``activation_checkpointing`` from 5.23, else ``gradient_checkpointing``)
    and ``use_cpu`` for a CPU result. Everything else (learning rate, output folder, ...) is kept. A
    result measured on the CPU although the CPU was not asked for is refused unless ``allow_cpu``. With
    ``guard``, for a :class:`~autobatch.integrations.hf_trainer.GuardedTrainer`: the per-device batch is
    the per-rank batch (micro-batch x accumulation) and the accumulation 1, so the guard owns the split.
    This process, which trains with the arguments, is set to the plan's environment as far as a started
    process can be (a CPU result: the allocator the probes ran, :func:`~autobatch.devices.cpu.hold_environment_here`).
    """
    from autobatch.devices.cpu import hold_environment_here
    from autobatch.emit.common import EmitOptions, check_device, installed_version
    from autobatch.emit.hf import training_arguments
    from autobatch.records.result import TuneResult

    loaded = result if isinstance(result, TuneResult) else TuneResult.load(result)
    options = EmitOptions(transformers_version=installed_version("transformers"), allow_cpu=allow_cpu)
    check_device(loaded, "TrainingArguments", options)
    if loaded.chosen is not None:
        hold_environment_here(loaded.chosen.environment)
    fields = training_arguments(loaded, options)
    fields.pop("output_dir")
    if guard:
        fields["per_device_train_batch_size"] *= fields["gradient_accumulation_steps"]
        fields["gradient_accumulation_steps"] = 1
    known = {f.name for f in dataclasses.fields(args)}
    for key in ("activation_checkpointing", "gradient_checkpointing"):
        if key in known and key not in fields and getattr(args, key, False):
            fields[key] = (
                False  # the alias the installed version does not read must not contradict the result
            )
    return dataclasses.replace(args, **{k: v for k, v in fields.items() if k in known})
