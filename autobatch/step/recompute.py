"""Activation recomputation: wrap the model's repeated blocks in non-reentrant checkpointing.

Blocks are the classes the user names (``--recompute-class`` or ``RECOMPUTE_CLASSES`` in the script), or,
detected, the outermost repeated children of the model's ``nn.ModuleList`` and ``nn.Sequential``
containers holding the most parameters:

* a class is *repeated* when two or more children of such containers, holding parameters, are of it;
* a block is an instance of a repeated class inside no instance of a repeated class (a class that lives
  inside another repeated class is not a block), a container's child;
* of the classes with two such instances or more, the one whose instances hold the most parameters is
  wrapped (ties: more instances, then the first found, outermost first).

Why not the most repeated class, as before: a decoder of 12 ``Block`` modules in a ``ModuleList``, each
keeping its MLP in an ``nn.Sequential(Linear, GELU, Linear)``, holds 24 ``Linear`` layers in containers.
Checkpointing a single ``Linear`` saves nothing (it keeps its input either way): recomputation wrapped
the Linears and found the maximum it found without (``tests/scripts/decoder.py`` under a 1 GiB cap on
the CPU: 14 against 14), where wrapping the blocks fits 33-34.
Why the most parameters: a stem or a head kept in a ``Sequential`` of two layers is repeated and
outermost too. A child that is a plain ``nn.Sequential``, ``nn.ModuleList`` or ``nn.ModuleDict`` is never
a block (wrapped by its class name, every container of the model would be): detection looks inside it.
"""

from __future__ import annotations

import functools
from collections import Counter, deque
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from autobatch.errors import NoBlocksError

_HOLDERS = (torch.nn.ModuleList, torch.nn.Sequential)  # whose repeated children may be blocks
_PLAIN_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)


def detect_blocks(model: torch.nn.Module) -> tuple[str, ...]:
    """The outermost repeated block class holding the most parameters (see the module docstring) as a
    1-tuple; empty when the model has none."""
    repeated = {name for name, count in _held(model.modules()).items() if count >= 2}
    counts: Counter[str] = Counter()
    params: Counter[str] = Counter()
    pending = deque([model])
    while pending:  # top-down, never inside an instance of a repeated class
        module = pending.popleft()
        for child in module.children():
            name = type(child).__name__
            held = sum(p.numel() for p in child.parameters()) if isinstance(module, _HOLDERS) else 0
            if name not in repeated:
                pending.append(child)
            elif held:
                counts[name] += 1
                params[name] += held
    blocks = [name for name in params if counts[name] >= 2]
    if not blocks:
        return ()
    return (max(blocks, key=lambda name: (params[name], counts[name])),)


def _held(holders: Iterable[torch.nn.Module]) -> Counter[str]:
    """How many children of the ``ModuleList`` and ``Sequential`` containers among ``holders`` are of
    each class, counting those that hold parameters (plain containers aside: see the module docstring)."""
    counts: Counter[str] = Counter()
    for holder in holders:
        if isinstance(holder, _HOLDERS):
            counts.update(
                type(child).__name__
                for child in holder.children()
                if type(child) not in _PLAIN_CONTAINERS and any(True for _ in child.parameters())
            )
    return counts


def count_blocks(model: torch.nn.Module, class_names: tuple[str, ...]) -> dict[str, int]:
    """How many modules of each named class the model holds (what :func:`wrap_blocks` would wrap)."""
    counts = Counter(type(m).__name__ for m in model.modules() if type(m).__name__ in class_names)
    return {name: counts[name] for name in class_names if counts[name]}


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
