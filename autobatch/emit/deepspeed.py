"""DeepSpeed config JSON: the batch triple, the precision sections and the optimizer.

Where each number lands (``deepspeed.runtime.config.DeepSpeedConfig`` reads them):

* ``train_micro_batch_size_per_gpu`` = micro-batch, ``gradient_accumulation_steps`` = accumulation,
  ``train_batch_size`` = micro x accumulation x world (DeepSpeed asserts exactly this product
  against its data-parallel world size, so the file is consistent for the planned world only).
* ``bf16.enabled`` / ``fp16.enabled``: both always written, so a base config's ``"auto"`` or a
  stale setting cannot survive. ``bf16-mixed`` and ``bf16-true`` enable bf16 (DeepSpeed has no
  autocast-only or pure-bf16 switch here; Lightning's DeepSpeed strategy maps both the same way);
  ``16-mixed`` enables fp16 with dynamic loss scaling (``loss_scale: 0``, initial scale 2^16, as
  torch's GradScaler); ``32-true`` enables neither.
* ``optimizer``, only when asked for (``EmitOptions.deepspeed_optimizer``, ``--deepspeed-optimizer``)
  or when the base config has an optimizer section: otherwise DeepSpeed, the HF Trainer and
  Lightning use the optimizer the training code builds, at its learning rate (a section without a
  learning rate would make them train at DeepSpeed's default). ``optimizer.type``: adam -> ``Adam`` with ``adam_w_mode: false`` (DeepSpeed's Adam is AdamW
  unless told otherwise), adamw / adamw-fused -> ``AdamW``, adagrad -> ``Adagrad`` (DeepSpeed's
  own names); sgd / sgd-momentum -> ``SGD`` (momentum 0.9 for the latter), rmsprop -> ``RMSprop``,
  adafactor -> ``Adafactor``: names DeepSpeed does not know are looked up in ``torch.optim``, case
  and all, and as ZeRO accepts only its tested optimizers, ``zero_allow_untested_optimizer: true``
  comes with them. No learning rate is written: that stays the user's.

Activation recomputation has no switch in the DeepSpeed config (its ``activation_checkpointing``
section only tunes ``deepspeed.checkpointing`` calls the model makes), so it is left out and noted.
JSON has no comments and DeepSpeed's config models reject unknown keys, so the provenance and the
arithmetic are not in this file; :func:`caveats` returns them for the command to print.

With a base config (``EmitOptions.deepspeed_base``), only the keys above change; everything else,
the ZeRO section included, is kept. A base ``"auto"`` batch value is replaced by the number. A
base optimizer of the same type keeps its params; one of another type is replaced, keeping only
``lr`` and ``weight_decay``. A base without an optimizer section gets none unless asked for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autobatch.emit import launcher_fields as strategy
from autobatch.emit.common import SGD_MOMENTUM, EmitOptions, require_chosen, script_own
from autobatch.errors import UsageError
from autobatch.records.result import Chosen, TuneResult

#: autobatch optimizer -> (DeepSpeed ``optimizer.type``, params that make it the same algorithm).
OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "sgd": ("SGD", {}),
    "sgd-momentum": ("SGD", {"momentum": SGD_MOMENTUM}),
    "adam": ("Adam", {"adam_w_mode": False}),
    "adamw": ("AdamW", {}),
    "adamw-fused": ("AdamW", {}),
    "adafactor": ("Adafactor", {}),
    "rmsprop": ("RMSprop", {}),
    "adagrad": ("Adagrad", {}),
}
#: Types ZeRO runs without ``zero_allow_untested_optimizer`` (DeepSpeed's ZERO_SUPPORTED_OPTIMIZERS).
_ZERO_TESTED = {"adam", "adamw", "adagrad"}
#: Optimizer params every torch optimizer accepts, kept from a base optimizer of another type.
_PORTABLE_PARAMS = ("lr", "weight_decay")


def render_deepspeed(result: TuneResult, options: EmitOptions) -> str:
    """The DeepSpeed config as JSON text (the base config overlaid, when one is given)."""
    chosen = require_chosen(result)
    base = load_base(options.deepspeed_base) if options.deepspeed_base else None
    return json.dumps(deepspeed_config(chosen, base, optimizer=options.deepspeed_optimizer), indent=2) + "\n"


def deepspeed_config(
    chosen: Chosen, base: dict[str, Any] | None = None, *, optimizer: bool = False
) -> dict[str, Any]:
    """The config dict: ``base`` (not modified) with the keys autobatch decides set from ``chosen``;
    an optimizer section when ``optimizer`` is asked for or the base has one."""
    config: dict[str, Any] = json.loads(json.dumps(base)) if base is not None else {}
    config["train_batch_size"] = chosen.micro_batch_size * chosen.accumulation_steps * chosen.world_size
    config["train_micro_batch_size_per_gpu"] = chosen.micro_batch_size
    config["gradient_accumulation_steps"] = chosen.accumulation_steps
    if script_own(chosen):  # the script's own precision and optimizer: the base's sections, untouched
        return config

    bf16 = {**_section(config.pop("bfloat16", None)), **_section(config.get("bf16"))}
    config["bf16"] = {**bf16, "enabled": chosen.precision in ("bf16-mixed", "bf16-true")}
    fp16 = _section(config.get("fp16"))
    if chosen.precision == "16-mixed" and not fp16:
        fp16 = {"loss_scale": 0, "initial_scale_power": 16}
    config["fp16"] = {**fp16, "enabled": chosen.precision == "16-mixed"}

    if optimizer or isinstance(config.get("optimizer"), dict):
        ds_type, params = OPTIMIZERS[chosen.optimizer]
        config["optimizer"] = _optimizer(config.get("optimizer"), ds_type, params)
        if ds_type.lower() not in _ZERO_TESTED:
            config["zero_allow_untested_optimizer"] = True
    return config


def _optimizer(current: dict[str, Any] | None, ds_type: str, params: dict[str, Any]) -> dict[str, Any]:
    if current and str(current.get("type", "")).lower() == ds_type.lower():
        kept = dict(current.get("params") or {})
        return {**current, "type": ds_type, "params": {**params, **kept}}
    old = dict((current or {}).get("params") or {})
    portable = {k: old[k] for k in _PORTABLE_PARAMS if k in old}
    merged = {**portable, **params}
    return {"type": ds_type, "params": merged} if merged else {"type": ds_type}


def _section(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def load_base(path: str | Path) -> dict[str, Any]:
    """Read the user's DeepSpeed config: JSON, or HJSON (as DeepSpeed accepts) when hjson is installed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"cannot read the DeepSpeed base config {path}: {exc.strerror or exc}",
            hint="pass an existing DeepSpeed JSON file with --base",
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        data = _hjson(text)
        if data is None:
            raise UsageError(
                f"{path} is not valid JSON: {exc}",
                hint="fix the DeepSpeed base config, or pass another one with --base",
            ) from None
    if not isinstance(data, dict):
        raise UsageError(
            f"{path} holds a JSON {type(data).__name__}, not an object",
            hint='a DeepSpeed config is a JSON object such as {"zero_optimization": {"stage": 2}}',
        )
    return data


def _hjson(text: str) -> dict[str, Any] | None:
    try:
        import hjson
    except ImportError:
        return None
    try:
        data = hjson.loads(text)
    except Exception:  # hjson raises its own decode errors
        return None
    return json.loads(json.dumps(data))


def caveats(result: TuneResult, options: EmitOptions) -> list[str]:
    """What the JSON cannot say: where DeepSpeed differs from the measured step, and what to add."""
    chosen = require_chosen(result)
    notes: list[str] = strategy.caveat(chosen, "deepspeed")
    if script_own(chosen):
        return notes
    if chosen.precision != "32-true":
        notes.append(
            "DeepSpeed's bf16/fp16 modes keep low-precision weights plus fp32 master weights in the "
            f"optimizer, not autocast over fp32 weights: memory per parameter differs from the measured {chosen.precision} step"
        )
    if chosen.recompute:
        notes.append(
            "recompute: the DeepSpeed config cannot switch it on; checkpoint your model's blocks "
            "(torch.utils.checkpoint or deepspeed.checkpointing.checkpoint)"
        )
    base = load_base(options.deepspeed_base) if options.deepspeed_base else None
    base_optimizer = base.get("optimizer") if base is not None else None
    if isinstance(base_optimizer, dict) or options.deepspeed_optimizer:
        params = base_optimizer.get("params") if isinstance(base_optimizer, dict) else None
        if not (isinstance(params, dict) and "lr" in params):
            notes.append(
                "the optimizer section sets no learning rate: DeepSpeed's default applies unless your code "
                'passes an optimizer; under the HF Trainer, give the base config "lr": "auto"'
            )
    else:
        notes.append(
            f"no optimizer section: build {chosen.optimizer} in your code and pass it to deepspeed.initialize "
            "(the HF Trainer and Lightning pass theirs); --deepspeed-optimizer writes one"
        )
    return notes
