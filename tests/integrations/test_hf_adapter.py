"""The Hugging Face adapter in this process: models from configs, synthesised batches, the model's own
loss and layers, and a result applied to TrainingArguments (loaded by the real transformers)."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.consumers
if importlib.util.find_spec("transformers") is None:  # found, not imported: collection stays quick
    pytest.skip("transformers is not installed", allow_module_level=True)

import torch  # noqa: E402
from hf_configs import bert, gpt2  # noqa: E402

from autobatch.errors import ContractError, UsageError  # noqa: E402
from autobatch.integrations.hf import apply_to_training_arguments  # noqa: E402
from autobatch.records.result import Chosen, TuneResult  # noqa: E402
from autobatch.settings.levers import in_words  # noqa: E402
from autobatch.step.contract import load_script, load_spec  # noqa: E402
from autobatch.step.hf import HFScript
from autobatch.step.spec import ScriptSpec  # noqa: E402


def test_a_causal_lm_from_its_config(tmp_path: Path) -> None:
    script = load_spec(ScriptSpec("hf", str(gpt2(tmp_path)), {"task": "causal-lm", "seq_len": 16}))
    assert script.recompute_classes == ("GPT2Block",)  # the model's own decoder layers
    model = script.build_model()
    assert type(model).__name__ == "GPT2LMHeadModel"
    batch = script.make_batch(3)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == (3, 16) and int(batch["input_ids"].max()) < 512
    assert torch.equal(batch["labels"], batch["input_ids"]) and bool(batch["attention_mask"].all())
    assert torch.equal(script.make_batch(3)["input_ids"], batch["input_ids"])  # the same batch in every probe
    loss = script.compute_loss(model, batch)
    assert loss.ndim == 0 and loss.requires_grad


def test_a_classifier_whose_task_comes_from_its_architectures(tmp_path: Path) -> None:
    script = HFScript(bert(tmp_path))  # a config.json path; no task, no seq_len
    assert script.task == "seq-classification" and script.seq_len == 128  # the model's maximum positions
    assert script.RECOMPUTE_CLASSES == ("BertLayer",)
    batch = script.make_batch(4)
    assert batch["labels"].shape == (4,) and int(batch["labels"].max()) < 3
    assert script.compute_loss(script.build_model(), batch).requires_grad


@pytest.mark.parametrize(
    "task, keys",
    [
        ("masked-lm", {"labels"}),
        ("token-classification", {"labels"}),
        ("question-answering", {"start_positions", "end_positions"}),
    ],
)
def test_other_tasks_get_their_labels(tmp_path: Path, task: str, keys: set[str]) -> None:
    script = HFScript(bert(tmp_path, num_labels=2), task, 8)
    batch = script.make_batch(2)
    assert keys <= set(batch)
    assert script.compute_loss(script.build_model(), batch).requires_grad


def test_what_the_config_cannot_tell_is_asked_for(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot tell the task") as info:
        HFScript(gpt2(tmp_path))  # GPT2Config() names no architectures
    hint = str(info.value.hint)  # a step's text names the lever neutrally: each door renders it
    assert "--hf-task" in in_words(hint, "cli") and "hf_task=" in in_words(hint, "api")
    with pytest.raises(UsageError, match="longer than the model's 128 positions"):
        HFScript(gpt2(tmp_path), "causal-lm", 4096)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="the folder has no config.json"):
        HFScript(tmp_path / "empty")
    with pytest.raises(UsageError, match="no Hugging Face config at"):
        HFScript(tmp_path / "missing.json")


SCRIPT_WITHOUT_LOSS = """
import transformers

def build_model():
    return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained({folder!r}))

def make_batch(batch_size):
    import torch
    ids = torch.randint(0, 512, (batch_size, 8))
    return {{"input_ids": ids, "labels": ids}}
"""


def test_a_script_with_a_pretrained_model_and_labels_needs_no_compute_loss(tmp_path: Path) -> None:
    folder = gpt2(tmp_path / "gpt2")
    (tmp_path / "train.py").write_text(SCRIPT_WITHOUT_LOSS.format(folder=str(folder)))
    script = load_script(tmp_path / "train.py")
    model = script.build_model()
    assert script.compute_loss(model, script.make_batch(2)).requires_grad
    with pytest.raises(ContractError, match="(?s)without labels.*def compute_loss"):
        script.compute_loss(model, {"input_ids": torch.zeros(2, 8, dtype=torch.long)})
    with pytest.raises(ContractError, match="not a transformers PreTrainedModel"):
        script.compute_loss(torch.nn.Linear(2, 2), {"labels": torch.zeros(2)})


def result_for(precision: str, optimizer: str, recompute: bool, device: dict[str, object]) -> TuneResult:
    result = TuneResult("train.py", [], device, "throughput", [])
    result.chosen = Chosen(precision, optimizer, recompute, 24, 4, 1, 96, 96)
    return result


CPU = {"type": "cpu", "name": "cpu", "budget_bytes": 1 << 30, "requested": "cpu"}


def test_a_result_applied_to_training_arguments(tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "out"), learning_rate=3e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the key this transformers reads, no deprecated alias
        tuned = apply_to_training_arguments(result_for("bf16-mixed", "sgd-momentum", True, CPU), args)
    assert (tuned.per_device_train_batch_size, tuned.gradient_accumulation_steps) == (24, 4)
    assert tuned.bf16 and not tuned.fp16 and tuned.use_cpu
    assert tuned.learning_rate == 3e-4 and tuned.output_dir == str(tmp_path / "out")  # the user's stay
    checkpointing = (
        "activation_checkpointing" if hasattr(tuned, "activation_checkpointing") else "gradient_checkpointing"
    )
    assert getattr(tuned, checkpointing) is True
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(tuned)
    assert cls.__name__ == "SGD" and kwargs.get("momentum") == 0.9
    assert args.per_device_train_batch_size == 8  # a new object: the original is unchanged


def test_training_arguments_refuse_a_cpu_fallback(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    fallback = {**CPU, "requested": "auto"}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result_for("32-true", "adamw", False, fallback).to_dict()))
    args = TrainingArguments(output_dir=str(tmp_path / "out"))
    with pytest.raises(UsageError, match="fell back to the CPU"):
        apply_to_training_arguments(path, args)
    assert apply_to_training_arguments(path, args, allow_cpu=True).use_cpu


def test_a_result_applied_for_the_guard_gives_it_the_whole_per_rank_batch(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from autobatch import Guard
    from autobatch.integrations.hf_trainer import GuardedTrainer

    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[])
    result = result_for("32-true", "adamw", False, CPU)
    guarded = apply_to_training_arguments(result, args, guard=True)
    assert (guarded.per_device_train_batch_size, guarded.gradient_accumulation_steps) == (96, 1)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16))
    guard = Guard(24, batch_size=96)
    assert GuardedTrainer(model=model, args=guarded, guard=guard).guard is guard
    with pytest.raises(UsageError, match=r"gradient_accumulation_steps is 4, not 1.*not the plan's per-rank"):
        GuardedTrainer(model=model, args=apply_to_training_arguments(result, args), guard=guard)
