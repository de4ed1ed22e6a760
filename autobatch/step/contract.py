"""The user contract (docs/script.md): import a training script and look up its functions.

The script is imported under its own module name, never as ``__main__`` (its
``if __name__ == "__main__":`` block does not run), with ``sys.argv`` set to the script path plus
the arguments given after ``--``. Its folder is put first on ``sys.path`` so that its own imports work.

Every other way of naming the step (a ``package.module:attribute`` reference, callables shipped by
value, a Hugging Face config, a LightningModule) arrives as a script spec (:mod:`autobatch.step.spec`) and
becomes the same three functions here, checked the same way (:func:`user_script`).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from autobatch.errors import ContractError
from autobatch.settings.levers import neutral
from autobatch.step.as_is import defines_none, no_way_error
from autobatch.step.importing import import_file, import_reference, translated
from autobatch.step.spec import ScriptSpec

if TYPE_CHECKING:
    import torch

SIGNATURES = {
    "build_model": ("def build_model() -> torch.nn.Module", 0),
    "make_batch": ("def make_batch(batch_size: int)  # tensors or nested tuples/lists/dicts of tensors", 1),
    # ... or make_batch(batch_size: int, seq_len: int) when the tune searches sequence lengths (--seq-len)
    "compute_loss": ("def compute_loss(model, batch) -> torch.Tensor  # a scalar", 2),
}


@dataclass(frozen=True)
class UserScript:
    """The functions of a loaded training script."""

    path: Path
    module: ModuleType
    build_model: Callable[[], Any]
    make_batch: Callable[[int], Any]
    compute_loss: Callable[[Any, Any], Any]
    recompute_classes: tuple[str, ...] = ()

    @property
    def takes_seq_len(self) -> bool:
        """Whether ``make_batch`` takes a second argument, the sequence length."""
        return _accepts(self.make_batch, 2)

    def batch(self, batch_size: int, seq_len: int | None = None) -> Any:
        """``make_batch(batch_size)``, or ``make_batch(batch_size, seq_len)`` when a length is asked for."""
        if seq_len is None:
            return self.make_batch(batch_size)
        if not self.takes_seq_len:
            raise ContractError(
                f"--seq-len asks for sequences of {seq_len} tokens, and make_batch{_sig(self.make_batch)} "
                "takes no length",
                hint="def make_batch(batch_size, seq_len=512): return batches of seq_len tokens per sample "
                "(the second parameter may have a default), or run without --seq-len",
            )
        return self.make_batch(batch_size, seq_len)  # type: ignore[call-arg]


def load_script(path: str | Path | Mapping[str, Any], args: list[str] | tuple[str, ...] = ()) -> UserScript:
    """Import the script and check that it offers the contract's functions.

    ``path`` is a script's path, or a script spec record (:class:`autobatch.step.spec.ScriptSpec`, as the probe
    server's init message carries it) naming a reference, a pickled object, an HF config or a Lightning module.
    """
    if isinstance(path, Mapping):
        return load_spec(ScriptSpec.from_dict(path), args)
    path = Path(path).resolve()
    if path.is_file() and defines_none(path.read_text(errors="replace")):
        raise no_way_error(path.name)  # never imported: it would run its training loop here
    sys.argv = [str(path), *args]
    module = import_file(path)
    return user_script(module, path.name, path)


def load_spec(spec: ScriptSpec, args: list[str] | tuple[str, ...] = ()) -> UserScript:
    """The functions a script spec names (see :mod:`autobatch.step.spec`), checked like a script's."""
    if spec.kind == "path":
        return load_script(spec.target, args)
    sys.argv = [spec.label, *args]
    sys.path.extend(folder for folder in spec.sys_path if folder not in sys.path)
    with translated(spec.label):
        if spec.kind == "reference":
            found = import_reference(spec.target, "reference")
        elif spec.kind == "pickled":
            import cloudpickle

            found = cloudpickle.loads(Path(spec.target).read_bytes())
        elif spec.kind == "hf":
            from autobatch.step.hf import HFScript

            found = HFScript(spec.target, spec.options.get("task"), spec.options.get("seq_len"))
        else:
            from autobatch.step.lightning import from_targets

            found = from_targets(spec.target, **spec.options)
    return user_script(found, spec.label, Path(spec.target))


def user_script(found: Any, name: str, path: Path) -> UserScript:
    """Check that ``found`` (a module, or any object) offers the contract's functions.

    Without ``compute_loss``, in a script that imported transformers, the loss is the model's own
    (``model(**batch).loss``): for a ``build_model`` that returns a ``PreTrainedModel`` and batches that
    carry labels, checked at the first step.
    """
    functions: dict[str, Any] = {}
    problems = []
    for fname, (signature, nargs) in SIGNATURES.items():
        fn = getattr(found, fname, None)
        if fn is None and fname == "compute_loss" and "transformers" in sys.modules:
            from autobatch.step.hf import model_loss

            fn = model_loss  # checked at the first step: a PreTrainedModel, and labels in the batch
        if fn is None:
            problems.append(f"{name} does not define {fname}; expected:\n    {signature}")
        elif not callable(fn):
            problems.append(f"{name}: {fname} is not a function; expected:\n    {signature}")
        elif not _accepts(fn, nargs):
            problems.append(
                f"{name}: {fname}{_sig(fn)} does not take {nargs} argument(s); expected:\n    {signature}"
            )
        functions[fname] = fn
    if problems:
        raise ContractError(
            "\n".join(problems),
            hint="a training script defines build_model(), make_batch(batch_size) and compute_loss(model, batch); see examples/",
        )
    classes = getattr(found, "RECOMPUTE_CLASSES", ())
    if isinstance(classes, str):
        classes = (classes,)
    module = found if isinstance(found, ModuleType) else ModuleType(name)
    return UserScript(
        path,
        module,
        functions["build_model"],
        functions["make_batch"],
        functions["compute_loss"],
        tuple(classes),
    )


def check_model(model: object) -> torch.nn.Module:
    """What ``build_model()`` returned, if it is a ``torch.nn.Module``; a :class:`ContractError` otherwise."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ContractError(
            f"build_model() returned {type(model).__name__}, not a torch.nn.Module",
            hint=SIGNATURES["build_model"][0],
        )
    if any(p.device.type == "meta" for p in model.parameters()):
        raise ContractError(
            f"build_model() returned a {type(model).__name__} whose parameters are on the meta device: a meta "
            "tensor has a shape but no data, so no step can run on it",
            hint="build_model() must return a model with real parameters (build it on the CPU, or call "
            "model.to_empty(device='cpu') and load or initialise its weights)",
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise ContractError(
            f"build_model() returned a {type(model).__name__} with no trainable parameters: there is nothing "
            "for an optimizer to train",
            hint="return the model you train (with its layers), and do not freeze every parameter",
        )
    return model


#: How the batch-size check is turned off, named in its error (the ``check_batch_size`` setting).
BATCH_CHECK_OFF = (
    "check_batch_size = false under [script] in autobatch.toml, AUTOBATCH_CHECK_BATCH_SIZE=0, "
    f"or {neutral('check_batch_size', False)}"
)


def check_batch(
    batch: object, batch_size: int, *, check_size: bool = True, seq_len: int | None = None
) -> None:
    """``make_batch(batch_size)`` must return tensors, or nested tuples/lists/dicts holding some, and
    (``check_size``) every tensor with a dimension must carry ``batch_size`` in its leading one.

    Why: a ``make_batch`` that ignores its argument makes every probe the same size, so peaks stay
    flat and the search reports any batch as fitting (a silently wrong maximum). Tensors of no
    dimension (a scalar such as a temperature) are exempt. Scripts whose layout differs (sequence
    first, packed sequences) turn the check off with the ``check_batch_size`` setting.
    """
    import torch
    from torch.utils._pytree import keystr, tree_flatten_with_path

    leaves, _ = tree_flatten_with_path(batch)
    tensors = [(keystr(path), leaf) for path, leaf in leaves if isinstance(leaf, torch.Tensor)]
    if not tensors:
        raise ContractError(
            f"make_batch({batch_size}) returned {type(batch).__name__} with no tensors",
            hint="make_batch(batch_size) must return tensors or nested tuples/lists/dicts of tensors",
        )
    meta = [path for path, t in tensors if t.device.type == "meta"]
    if meta:
        shown = ", ".join(f"batch{path}" for path in meta[:3]) + (
            f" (and {len(meta) - 3} more)" if len(meta) > 3 else ""
        )
        raise ContractError(
            f"make_batch({batch_size}) returned tensors on the meta device ({shown}): a meta tensor has a "
            "shape but no data, so no step can run on it",
            hint="make_batch(batch_size) must return real tensors (your data, or torch.randn/torch.zeros on the "
            "CPU or the device): autobatch measures memory by running the real step on them",
        )
    if not check_size:
        return
    wrong = [(path, t) for path, t in tensors if t.dim() > 0 and t.shape[0] != batch_size]
    if wrong:
        shown = ", ".join(f"batch{path or ''} has shape {tuple(t.shape)}" for path, t in wrong[:3])
        more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
        raise ContractError(
            f"make_batch({batch_size}) returned tensors whose leading dimension is not {batch_size}: "
            f"{shown}{more}",
            hint=f"make_batch(batch_size) must put batch_size samples in the first dimension of every tensor "
            f"(otherwise every probe has the same size and the maximum is wrong); if your layout differs "
            f"on purpose, turn this check off: {BATCH_CHECK_OFF}",
        )
    if seq_len is not None:
        _check_length(tensors, batch_size, seq_len)


def _check_length(tensors: list[tuple[str, torch.Tensor]], batch_size: int, seq_len: int) -> None:
    """With a sequence length, some tensor must carry it in its second dimension: a ``make_batch`` that
    ignores ``seq_len`` makes every length the same shape, and every length's maximum the same."""
    if any(t.dim() >= 2 and t.shape[1] == seq_len for _, t in tensors):
        return
    shown = ", ".join(f"batch{path or ''} has shape {tuple(t.shape)}" for path, t in tensors[:3])
    raise ContractError(
        f"make_batch({batch_size}, {seq_len}) returned no tensor with {seq_len} in its second dimension: {shown}",
        hint=f"make_batch(batch_size, seq_len) must return batches of seq_len tokens per sample, shaped "
        f"(batch_size, seq_len, ...) (otherwise every length measures the same); if your layout differs on "
        f"purpose, turn this check off: {BATCH_CHECK_OFF}",
    )


def check_loss(loss: object) -> torch.Tensor:
    """What ``compute_loss(model, batch)`` returned, if it is a scalar tensor connected to the parameters."""
    import torch

    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad:
        return loss
    if not isinstance(loss, torch.Tensor):
        what = type(loss).__name__
    elif loss.numel() == 1:
        what = "a scalar that does not require grad (is the model used?)"
    else:
        what = f"a tensor of shape {tuple(loss.shape)}"
    raise ContractError(
        f"compute_loss(model, batch) returned {what}",
        hint="def compute_loss(model, batch) -> torch.Tensor  # a scalar connected to the model's parameters",
    )


def check_finite_loss(loss: torch.Tensor) -> None:
    """The first step's loss must be finite: NaN or inf there is a broken ``compute_loss`` (log of zero,
    a division by zero), not training dynamics. Later steps are not checked (memory does not depend on
    it), nor are fake tensors (they hold no values)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(loss, FakeTensor) or loss.is_meta:
        return
    value = float(loss.detach().float().reshape(()))
    if not torch.isfinite(torch.tensor(value)):
        raise ContractError(
            f"compute_loss(model, batch) returned {value} at the first step",
            hint="the loss must be a finite number: look for a log of zero, a division by zero or an "
            "uninitialised tensor in compute_loss or make_batch",
        )


def _accepts(fn: Callable[..., Any], nargs: int) -> bool:
    try:
        inspect.signature(fn).bind(*([None] * nargs))
    except TypeError:
        return False
    except ValueError:  # builtins without a signature
        return True
    return True


def _sig(fn: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"
