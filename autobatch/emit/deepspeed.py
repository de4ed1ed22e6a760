"""DeepSpeed config JSON: the batch triple, the precision sections and the optimizer.

:func:`render_deepspeed` writes ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps`` and
``train_batch_size``, the bf16/fp16 sections, and an ``optimizer`` section only when asked for or when the
base config has one; with a base config only those keys change. JSON has no comments, so the provenance and
what the file cannot say come back from :func:`caveats`. Where each number lands: docs/clusters.md ("The
DeepSpeed config").
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
    old = dict((current or {}).get("params") or {})
    algorithms = {_algorithm(current or {}), _algorithm({"type": ds_type, "params": params})}
    if current and len(algorithms) == 1:
        return {**current, "params": {**params, **old}}
    if algorithms <= {"adam", "adamw"}:  # the same hyperparameters, but for the one that tells them apart
        carried = {k: v for k, v in old.items() if k != "adam_w_mode"}
    else:
        carried = {k: old[k] for k in _PORTABLE_PARAMS if k in old}
    merged = {**carried, **params}
    return {"type": ds_type, "params": merged} if merged else {"type": ds_type}


def _algorithm(section: dict[str, Any]) -> str:
    """What an optimizer section runs: its type, in lower case, except that DeepSpeed's ``Adam`` is AdamW unless
    its ``adam_w_mode`` is false (so a base's ``Adam`` is the adamw a tune measured, and keeps its params)."""
    kind = str(section.get("type", "")).lower()
    params = section.get("params") or {}
    return "adamw" if kind == "adam" and params.get("adam_w_mode", True) is not False else kind


def _dropped(chosen: Chosen, base_optimizer: dict[str, Any]) -> list[str]:
    """The base optimizer's params that the tuned optimizer's section leaves out (it replaced the base's)."""
    ds_type, params = OPTIMIZERS[chosen.optimizer]
    written = _optimizer(base_optimizer, ds_type, params).get("params", {})
    return [name for name in base_optimizer.get("params") or {} if name not in written]


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
        if isinstance(base_optimizer, dict) and (dropped := _dropped(chosen, base_optimizer)):
            notes.append(
                f"the base config's optimizer {base_optimizer.get('type')} is replaced by "
                f"{OPTIMIZERS[chosen.optimizer][0]}, the one tuned, without its {', '.join(dropped)} "
                "(tune with -o for your optimizer to keep them)"
            )
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
