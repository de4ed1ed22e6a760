"""Hugging Face: a model built from its config (``tune --hf``), its own loss, and ``TrainingArguments``.

:class:`HFScript` is the three-function contract over a transformers model: the task's auto class
``.from_config`` (random weights, never downloaded), worst-case batches at ``seq_len`` tokens with the
task's labels, and ``model(**batch).loss``. :func:`model_loss` is the loss of a script that defines no
``compute_loss``; :func:`autobatch.integrations.hf.apply_to_training_arguments` puts a result into
``TrainingArguments``. Details: docs/huggingface.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autobatch.errors import ContractError, UsageError
from autobatch.settings.levers import neutral
from autobatch.step.spec import HF_TASKS, hf_config_file

if TYPE_CHECKING:
    pass

#: ``--hf-task`` -> the transformers auto class that builds the model.
AUTO_CLASSES = dict(
    zip(
        HF_TASKS,
        (
            "AutoModelForCausalLM",
            "AutoModelForMaskedLM",
            "AutoModelForSequenceClassification",
            "AutoModelForTokenClassification",
            "AutoModelForQuestionAnswering",
            "AutoModelForSeq2SeqLM",
        ),
        strict=False,
    )
)
#: Ends of architecture names (``config.architectures``) -> task.
ARCHITECTURES = (
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForMaskedLM", "masked-lm"),
    ("ForSequenceClassification", "seq-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForConditionalGeneration", "seq2seq-lm"),
)
#: Config attributes that hold the longest sequence a model takes, in the order they are looked up.
MAX_POSITIONS = ("max_position_embeddings", "n_positions", "max_sequence_length", "n_ctx")
#: Batch keys that make a transformers model compute its own loss.
LABEL_KEYS = ("labels", "start_positions")
SEED = 0


def task_from_config(config: Any) -> str:
    """The task the config's ``architectures`` name; a UsageError naming the tasks when it names none."""
    for architecture in getattr(config, "architectures", None) or ():
        for suffix, task in ARCHITECTURES:
            if architecture.endswith(suffix):
                return task
    named = ", ".join(getattr(config, "architectures", None) or []) or "none"
    raise UsageError(
        f"--hf: cannot tell the task from the config (architectures: {named})",
        hint=f"pass {neutral('hf_task')}, one of {', '.join(HF_TASKS)}",
    )


class HFScript:
    """``build_model``, ``make_batch`` and ``compute_loss`` over a transformers model built from its config."""

    def __init__(self, config_path: str | Path, task: str | None = None, seq_len: int | None = None) -> None:
        import transformers

        path = hf_config_file(config_path)
        self.config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
        self.task = task or task_from_config(self.config)
        if self.task not in AUTO_CLASSES:
            raise UsageError(
                f"--hf-task {self.task!r} is not a task", hint=f"use one of {', '.join(HF_TASKS)}"
            )
        self.auto_class = getattr(transformers, AUTO_CLASSES[self.task])
        self.vocab_size = _vocab_size(self.config)
        self.seq_len = _seq_len(self.config, seq_len)
        if self.task == "seq-classification" and getattr(self.config, "pad_token_id", None) is None:
            # A decoder classifies at the last non-padding token and needs to know the padding id.
            eos = getattr(self.config, "eos_token_id", None)
            self.config.pad_token_id = eos if isinstance(eos, int) and eos < self.vocab_size else 0
        self.RECOMPUTE_CLASSES = layer_classes(self.config, self.auto_class)

    def build_model(self) -> Any:
        return self.auto_class.from_config(self.config)

    def make_batch(self, batch_size: int, seq_len: int | None = None) -> dict[str, Any]:
        import torch

        gen = torch.Generator().manual_seed(SEED)
        tokens = _seq_len(self.config, seq_len) if seq_len is not None else self.seq_len
        shape = (batch_size, tokens)
        ids = torch.randint(0, self.vocab_size, shape, generator=gen)
        batch: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones(shape, dtype=torch.long)}
        batch.update(self._labels(batch_size, ids, gen, tokens))
        return batch

    def _labels(self, batch_size: int, ids: Any, gen: Any, tokens: int) -> dict[str, Any]:
        import torch

        labels = getattr(self.config, "num_labels", 2)
        if self.task in ("causal-lm", "masked-lm"):
            return {"labels": ids.clone()}
        if self.task == "seq2seq-lm":
            return {"labels": torch.randint(0, self.vocab_size, ids.shape, generator=gen)}
        if self.task == "token-classification":
            return {"labels": torch.randint(0, labels, ids.shape, generator=gen)}
        if self.task == "question-answering":
            where = torch.randint(0, tokens, (2, batch_size), generator=gen)
            return {"start_positions": where[0], "end_positions": where[1]}
        problem = getattr(self.config, "problem_type", None)
        if problem == "multi_label_classification":
            return {"labels": torch.randint(0, 2, (batch_size, labels), generator=gen).float()}
        if problem == "regression" or labels == 1:
            return {"labels": torch.randn(batch_size, labels, generator=gen).squeeze(-1)}
        return {"labels": torch.randint(0, labels, (batch_size,), generator=gen)}

    def compute_loss(self, model: Any, batch: Mapping[str, Any]) -> Any:
        return model(**batch).loss


def _vocab_size(config: Any) -> int:
    size = getattr(config, "vocab_size", None)
    if not isinstance(size, int) or size < 1:
        raise UsageError(
            f"--hf: the {type(config).__name__} has no vocab_size: autobatch synthesises token batches only",
            hint="for other models write a script with build_model, make_batch and compute_loss",
        )
    return size


def _seq_len(config: Any, seq_len: int | None) -> int:
    longest = next((v for v in (getattr(config, k, None) for k in MAX_POSITIONS) if isinstance(v, int)), None)
    if seq_len is None:
        if longest is None:
            raise UsageError(
                f"--hf: the {type(config).__name__} states no maximum sequence length",
                hint=f"pass {neutral('seq_lens')}, the longest sequence your job trains on",
            )
        return longest
    if longest is not None and seq_len > longest:
        raise UsageError(
            f"--seq-len {seq_len} is longer than the model's {longest} positions",
            hint=f"pass --seq-len {longest} or less",
        )
    return seq_len


def layer_classes(config: Any, auto_class: Any) -> tuple[str, ...]:
    """The class names of the model's own layers (see the module docstring); empty when none is known."""
    import inspect
    import sys

    try:
        from transformers.models.auto.auto_factory import _get_model_class

        model_class = _get_model_class(config, auto_class._model_mapping)
    except Exception:  # noqa: BLE001 - a private helper; without it, autobatch detects the blocks
        return ()
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer

        layer: type | None = GradientCheckpointingLayer
    except ImportError:  # transformers < 4.53
        layer = None
    module = sys.modules.get(model_class.__module__)
    if layer is not None and module is not None:
        found = [
            name
            for name, obj in vars(module).items()
            if inspect.isclass(obj) and issubclass(obj, layer) and obj.__module__ == module.__name__
        ]
        if found:
            return tuple(found)
    return tuple(getattr(model_class, "_no_split_modules", None) or ())


def _is_pretrained(model: Any) -> bool:
    return any(
        c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers")
        for c in type(model).__mro__
    )


def model_loss(model: Any, batch: Any) -> Any:
    """The loss of a script without ``compute_loss``: ``model(**batch).loss`` for a ``PreTrainedModel``
    and a batch that carries labels; a ContractError that shows the signature otherwise."""
    signature = "def compute_loss(model, batch) -> torch.Tensor  # a scalar"
    if not _is_pretrained(model):
        raise ContractError(
            f"the script defines no compute_loss, and build_model() returned {type(model).__name__}, not a "
            f"transformers PreTrainedModel whose own loss could be used; expected:\n    {signature}",
            hint="define compute_loss(model, batch)",
        )
    if not isinstance(batch, Mapping) or not any(key in batch for key in LABEL_KEYS):
        raise ContractError(
            "the script defines no compute_loss, so the loss is model(**batch).loss, but make_batch() returned "
            f"{'a dict without labels' if isinstance(batch, Mapping) else type(batch).__name__}; expected:\n"
            f"    {signature}",
            hint="return a dict of the model's inputs with labels from make_batch, or define compute_loss",
        )
    loss = model(**batch).loss
    if loss is None:
        raise ContractError(
            f"{type(model).__name__}(**batch) computed no loss; expected:\n    {signature}",
            hint="define compute_loss(model, batch)",
        )
    return loss
