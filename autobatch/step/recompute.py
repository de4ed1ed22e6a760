"""Activation recomputation: wrap the model's repeated blocks in non-reentrant checkpointing.

Blocks are the classes the user names (``--recompute-class`` or ``RECOMPUTE_CLASSES`` in the script),
or, auto-detected, the most repeated module class among the children of ``nn.ModuleList`` and
``nn.Sequential`` containers (at least two instances holding parameters).
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from autobatch.errors import NoBlocksError


def detect_blocks(model: torch.nn.Module) -> tuple[str, ...]:
    """The most repeated block class (ties: the one with more parameters) as a 1-tuple; empty when none."""
    counts: Counter[str] = Counter()
    params: Counter[str] = Counter()
    for module in model.modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            for child in module.children():
                n = sum(p.numel() for p in child.parameters())
                if n:
                    counts[type(child).__name__] += 1
                    params[type(child).__name__] += n
    repeated = [name for name, count in counts.items() if count >= 2]
    if not repeated:
        return ()
    best = max(repeated, key=lambda name: (counts[name], params[name]))
    return (best,)


def wrap_blocks(model: torch.nn.Module, class_names: tuple[str, ...]) -> int:
    """Wrap every module whose class is named in ``class_names``; returns how many were wrapped."""
    wrapped = 0
    for module in list(model.modules()):
        if type(module).__name__ in class_names and not getattr(module, "_autobatch_recompute", False):
            module.forward = _checkpointed(module.forward)  # type: ignore[method-assign]
            module._autobatch_recompute = True  # type: ignore[assignment]
            wrapped += 1
    return wrapped


def wrap_recompute(model: torch.nn.Module, class_names: tuple[str, ...]) -> tuple[str, ...]:
    """Wrap the named block classes (the detected ones when none are named); returns the classes.

    Raises :class:`~autobatch.errors.NoBlocksError` when there is nothing to wrap.
    """
    classes = class_names or detect_blocks(model)
    if not classes or not wrap_blocks(model, classes):
        raise NoBlocksError(
            "recomputation asked for, but the model has no repeated blocks to wrap"
            + (f" (no module of class {', '.join(classes)})" if classes else ""),
            hint="name the block classes with --recompute-class or RECOMPUTE_CLASSES, or pass --no-recompute",
        )
    return classes


def _checkpointed(forward: Any) -> Any:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
