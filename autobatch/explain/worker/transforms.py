"""Model changes that two levers stand for: in-place activations, and a smaller vocabulary.

Both are applied to the user's model after ``build_model()`` (for a prediction under fake tensors, and for
``explain --verify`` in a real probe), never to the user's code: :func:`apply_to_model` and
:func:`inplace_functional` switch activations to ``inplace=True``, :func:`trim_vocabulary` and
:func:`trim_batch` shrink the largest embedding, its output head and the batch's token ids.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from autobatch.explain.pure.records import Transforms

#: Functions of torch.nn.functional that accept ``inplace``.
INPLACE_FUNCTIONS: tuple[str, ...] = (
    "relu",
    "relu6",
    "leaky_relu",
    "elu",
    "selu",
    "celu",
    "silu",
    "mish",
    "hardtanh",
    "hardswish",
    "rrelu",
)


@dataclass
class Applied:
    """What the transforms changed, for the report."""

    inplace_modules: int = 0
    inplace_calls: int = 0
    vocab: tuple[int, int] | None = None  # (before, after)
    notes: list[str] = field(default_factory=list)


def apply_to_model(model: nn.Module, transforms: Transforms, applied: Applied) -> nn.Module:
    """Apply the model-side transforms in place and return the model."""
    if transforms.vocab_trim > 0:
        applied.vocab = trim_vocabulary(model, transforms.vocab_trim)
        if applied.vocab is None:
            applied.notes.append("no nn.Embedding: nothing to trim")
    if transforms.inplace:
        for module in model.modules():
            if type(module).__module__ == "torch.nn.modules.activation" and hasattr(module, "inplace"):
                if not module.inplace:
                    setattr(module, "inplace", True)  # noqa: B010 - nn.Module's typing hides the flag
                    applied.inplace_modules += 1
    return model


def trim_vocabulary(model: nn.Module, fraction: float) -> tuple[int, int] | None:
    """Keep the first ``(1 - fraction)`` rows of the largest embedding and of its output head.

    Every parameter tied to the embedding's weight follows (a GPT's output head); an untied head (the model's
    ``get_output_embeddings()``, else the last ``nn.Linear`` from the embedding's width to the vocabulary) is
    trimmed the same way, and no other layer. Integer tensors of the batch are then taken modulo the new
    vocabulary (:func:`trim_batch`) so that every token id stays valid.
    """
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    if not embeddings:
        return None
    embedding = max(embeddings, key=lambda m: m.num_embeddings)
    old = embedding.num_embeddings
    new = max(1, int(round(old * (1.0 - fraction))))
    weight = embedding.weight
    replacement = nn.Parameter(weight.detach()[:new].clone(), requires_grad=weight.requires_grad)
    tied = False
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is weight:
                module._parameters[name] = replacement
                tied = tied or module is not embedding
                if isinstance(module, nn.Linear):
                    module.out_features = new
    head = None if tied else _output_head(model, embedding)
    if head is not None:
        head.weight = nn.Parameter(head.weight.detach()[:new].clone())
        if head.bias is not None:
            head.bias = nn.Parameter(head.bias.detach()[:new].clone())
        head.out_features = new
    embedding.num_embeddings = new
    if embedding.padding_idx is not None and embedding.padding_idx >= new:
        embedding.padding_idx = None
    return old, new


def _output_head(model: nn.Module, embedding: nn.Embedding) -> nn.Linear | None:
    """The untied output head: the one the model names (Hugging Face's ``get_output_embeddings``), else the
    last ``nn.Linear`` from the embedding's width to its vocabulary (a hidden layer may be as wide as the
    vocabulary; heads are built last)."""
    named = getattr(model, "get_output_embeddings", None)
    if callable(named):
        head = named()
        return head if isinstance(head, nn.Linear) and head.out_features == embedding.num_embeddings else None
    shape = (embedding.num_embeddings, embedding.embedding_dim)
    heads = [m for m in model.modules() if isinstance(m, nn.Linear) and tuple(m.weight.shape) == shape]
    return heads[-1] if heads else None


def trim_batch(batch: Any, vocabulary: int) -> Any:
    """Integer tensors of the batch modulo the new vocabulary (token ids and targets stay valid)."""

    def fold(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.dtype != torch.bool:
            return value % vocabulary
        return value

    return tree_map(fold, batch)


@contextlib.contextmanager
def inplace_functional(applied: Applied) -> Iterator[None]:
    """Call the activation functions of ``torch.nn.functional`` with ``inplace=True`` inside the block.

    Activation modules that take ``inplace`` (``nn.ReLU``, ``nn.SiLU``, ...) get ``inplace=True``
    (:func:`apply_to_model`), and the matching functions here. An in-place activation overwrites its input
    instead of allocating an output, so the input buffer is not needed; it is only valid when autograd does not
    need that input (PyTorch raises during backward otherwise, and the lever is then reported as not
    applicable). GELU has no in-place form.
    """
    functional = torch.nn.functional
    originals = {name: getattr(functional, name) for name in INPLACE_FUNCTIONS if hasattr(functional, name)}

    def patched(original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def call(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.arguments["inplace"] = True
            applied.inplace_calls += 1
            return original(*bound.args, **bound.kwargs)

        return call

    try:
        for name, original in originals.items():
            setattr(functional, name, patched(original))
        yield
    finally:
        for name, original in originals.items():
            setattr(functional, name, original)


@contextlib.contextmanager
def applied_during_step(transforms: Transforms, applied: Applied) -> Iterator[None]:
    """The step-time side of the transforms (patched functions); a no-op when none is active."""
    if transforms.inplace:
        with inplace_functional(applied):
            yield
    else:
        yield
