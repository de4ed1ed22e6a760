"""Hugging Face ``TrainingArguments`` as JSON, for ``HfArgumentParser(TrainingArguments).parse_json_file``.

:func:`render_hf` maps the plan onto ``per_device_train_batch_size``, ``gradient_accumulation_steps``,
``bf16``/``fp16``, ``optim``, the recomputation key the transformers version reads, ``output_dir`` and
``use_cpu``. ``parse_json_file`` rejects unknown keys, so provenance comes back from :func:`caveats`.
Where each number lands: docs/huggingface.md ("The TrainingArguments file").
"""

from __future__ import annotations

import json
from typing import Any

from autobatch.emit import launcher_fields as strategy
from autobatch.emit.common import (
    SGD_MOMENTUM,
    EmitOptions,
    on_cpu,
    require_chosen,
    script_own,
    version_at_least,
)
from autobatch.records.result import TuneResult

#: autobatch optimizer -> TrainingArguments ``optim`` value (and ``optim_args``).
OPTIMIZERS: dict[str, tuple[str, str | None]] = {
    "sgd": ("sgd", None),
    "sgd-momentum": ("sgd", f"momentum={SGD_MOMENTUM}"),
    "adam": ("adamw_torch", None),
    "adamw": ("adamw_torch", None),
    "adamw-fused": ("adamw_torch_fused", None),
    "adafactor": ("adafactor", None),
    "rmsprop": ("rmsprop", None),
    "adagrad": ("adagrad", None),
}
#: First transformers release whose TrainingArguments names recomputation ``activation_checkpointing``.
ACTIVATION_CHECKPOINTING_SINCE = (5, 23)


def checkpointing_key(transformers_version: str | None) -> str:
    if version_at_least(transformers_version, ACTIVATION_CHECKPOINTING_SINCE):
        return "activation_checkpointing"
    return "gradient_checkpointing"


def training_arguments(result: TuneResult, options: EmitOptions) -> dict[str, Any]:
    """The TrainingArguments fields autobatch decides, by their names in ``options.transformers_version``."""
    chosen = require_chosen(result)
    args: dict[str, Any] = {
        "output_dir": options.hf_output_dir,
        "per_device_train_batch_size": chosen.micro_batch_size,
        "gradient_accumulation_steps": chosen.accumulation_steps,
    }
    if not script_own(chosen):
        optim, optim_args = OPTIMIZERS[chosen.optimizer]
        args.update(bf16=chosen.precision in ("bf16-mixed", "bf16-true"), fp16=chosen.precision == "16-mixed")
        args["optim"] = optim
        if optim_args:
            args["optim_args"] = optim_args
        args[checkpointing_key(options.transformers_version)] = chosen.recompute  # every layer: see caveats
        if chosen.compile:
            args["torch_compile"] = True
    if on_cpu(result):
        args["use_cpu"] = True
    args.update(strategy.hf_fields(result, chosen))
    return args


def render_hf(result: TuneResult, options: EmitOptions) -> str:
    """TrainingArguments JSON text."""
    return json.dumps(training_arguments(result, options), indent=2) + "\n"


def caveats(result: TuneResult, options: EmitOptions) -> list[str]:
    chosen = require_chosen(result)
    notes: list[str] = strategy.caveat(chosen, "hf")
    if chosen.world_size > 1:
        notes.append(
            f"launch {chosen.world_size} processes (torchrun --nproc-per-node / accelerate launch --num_processes): "
            "TrainingArguments has no world-size field"
        )
    if chosen.precision == "bf16-true":
        notes.append(
            "bf16-true: TrainingArguments has no pure-bf16 flag; bf16 is on, and the model must be "
            "loaded in bfloat16 (from_pretrained(..., dtype=torch.bfloat16))"
        )
    if chosen.optimizer == "adam":
        notes.append(
            "adam: TrainingArguments has no plain Adam; adamw_torch with weight_decay 0 (the default) is the same update"
        )
    if options.transformers_version is None:
        notes.append(
            "transformers version unknown: wrote gradient_checkpointing (accepted up to 5.x; "
            "5.23 renamed it activation_checkpointing)"
        )
    return notes
