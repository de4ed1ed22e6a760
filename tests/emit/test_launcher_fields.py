"""Configs of a tune measured with a strategy (ddp, fsdp), loaded by the real consumers: accelerate's
launch config, transformers' TrainingArguments (the Trainer's FSDP plugin arguments), Lightning's Trainer,
DeepSpeed's batch arithmetic."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from emit_cases import BY_NAME, OPTIONS

from autobatch.core.world import strategy_fields, strategy_world
from autobatch.emit import render
from autobatch.records.result import TuneResult

pytestmark = pytest.mark.consumers


def tuned(strategy: str, *, world: int = 8, nproc: int = 4, device: str = "cuda") -> TuneResult:
    """A tune measured with ``strategy`` on ``nproc`` ranks, planned for ``world`` processes."""
    case = BY_NAME["bf16-mixed_accum_w4"]
    result = replace(case, world=world, requested=12 * 5 * world, device=device).result()
    assert result.chosen is not None
    result.chosen = replace(result.chosen, **strategy_fields(strategy, nproc, world))
    result.distributed = {"strategy": strategy, "nproc_per_node": nproc, "blocks": ["Block"]}
    return result


def write(tmp_path: Path, result: TuneResult, fmt: str, name: str) -> Path:
    path = tmp_path / name
    path.write_text(render(result, fmt, OPTIONS), encoding="utf-8")
    return path


def test_world_size_is_nproc_times_nodes_unless_set() -> None:
    assert strategy_world("none", 4, 2, {}) is None
    assert strategy_world("fsdp", 4, 2, {})[0] == 8  # type: ignore[index]
    assert strategy_world("ddp", 4, None, {"SLURM_JOB_NUM_NODES": "3"})[0] == 12  # type: ignore[index]
    assert strategy_world("ddp", 2, None, {})[0] == 2  # type: ignore[index]
    assert strategy_fields("fsdp", 4, 8) == {"strategy": "fsdp", "nproc_per_node": 4, "num_nodes": 2}
    assert strategy_fields("none", 1, 2) == {
        "strategy": "none",
        "nproc_per_node": 2,
        "num_nodes": 1,
    }  # one node


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_accelerate_reads_the_strategy(tmp_path: Path, strategy: str) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(write(tmp_path, tuned(strategy), "accelerate", "accelerate.yaml")))
    assert (config.num_processes, config.num_machines) == (8, 2)
    if strategy == "fsdp":
        assert config.distributed_type.value == "FSDP"
        assert config.fsdp_config["fsdp_version"] == 2
        assert config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "Block"
    else:
        assert config.distributed_type.value == "MULTI_GPU"


def test_hf_training_arguments_build_the_fsdp2_plugin(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import HfArgumentParser, TrainingArguments

    data = json.loads(write(tmp_path, tuned("fsdp", device="cpu"), "hf", "args.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (args,) = HfArgumentParser(TrainingArguments).parse_dict(data)
    assert args.fsdp_config["version"] == 2
    assert args.fsdp_config["transformer_layer_cls_to_wrap"] == ["Block"]
    plugin: Any = getattr(args, "fsdp_plugin_args", None)
    if plugin is not None:  # the Accelerate plugin arguments the Trainer will build FSDP with
        assert plugin["fsdp_version"] == 2 and plugin["transformer_cls_names_to_wrap"] == "Block"
    assert (
        json.loads(write(tmp_path, tuned("ddp", device="cpu"), "hf", "ddp.json").read_text()).get("fsdp")
        is None
    )


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_lightning_trainer_takes_the_strategy(tmp_path: Path, strategy: str) -> None:
    pytest.importorskip("lightning")
    import yaml
    from lightning.pytorch import Trainer

    overlay = yaml.safe_load(
        write(tmp_path, tuned(strategy, world=2, nproc=2, device="cpu"), "lightning", "o.yaml").read_text()
    )
    trainer_args = overlay["trainer"]
    assert (trainer_args["strategy"], trainer_args["devices"], trainer_args["num_nodes"]) == (strategy, 2, 1)
    if strategy == "fsdp":
        return  # Lightning's FSDPStrategy runs on CUDA only: its keys are checked above
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(
            **{k: v for k, v in trainer_args.items() if k != "precision"},
            logger=False,
            enable_checkpointing=False,
        )
    assert (trainer.num_devices, trainer.num_nodes, trainer.world_size) == (2, 1, 2)
    assert type(trainer.strategy).__name__ == "DDPStrategy"


def test_deepspeed_batch_arithmetic_and_caveat(tmp_path: Path) -> None:
    text = write(tmp_path, tuned("fsdp"), "deepspeed", "ds.json").read_text()
    body = json.loads(text[text.index("{") :]) if not text.lstrip().startswith("{") else json.loads(text)
    assert body["train_batch_size"] == 12 * 5 * 8
