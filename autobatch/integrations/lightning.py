"""Lightning, for training with autobatch: the :class:`AutoBatch` and :class:`Guarded` callbacks.

:class:`AutoBatch` tunes in isolated probes when ``Trainer.fit`` starts (``on_fit_start``, where Lightning's
``BatchSizeFinder`` runs), through the same service as ``autobatch tune``, and trains with the result:
the batch size set where Lightning's finder sets it and, when a ``global_batch_size`` is asked for,
``trainer.accumulate_grad_batches``; with ``guard=True`` it trains under the runtime guard. :class:`Guarded`
runs ``fit`` under a guard given directly (:func:`install_guard`: how it fits Lightning's loop). (The
adapter that runs a LightningModule as the step, for ``tune --lightning``, is :mod:`autobatch.step.lightning`.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from lightning.pytorch import Callback

from autobatch.devices.cpu import hold_environment_here
from autobatch.errors import UsageError
from autobatch.step.lightning import (
    LightningScript,
    recipe,
    refuse_manual_optimization,
    set_batch_size,
    set_length,
)

if TYPE_CHECKING:
    from autobatch.api import ProbeEvent
    from autobatch.guard import Guard
    from autobatch.records.result import TuneResult

logger = logging.getLogger("autobatch")


class AutoBatch(Callback):
    """Tune the batch size in isolated probes when ``fit`` starts, then train with it.

    ``settings`` are autobatch settings by name (``memory="2GiB"``, ``headroom=0.2``, ...). By default it
    searches what the Trainer will run: the Trainer's precision, the optimizer ``configure_optimizers``
    built (by name: Adam, AdamW, SGD, ...), no recomputation, on the Trainer's device; pass
    ``precisions``, ``optimizers`` or ``recompute`` to change that. With ``global_batch_size`` the plan
    splits it over ``trainer.world_size`` processes and ``accumulate_grad_batches`` is set; without it the
    Trainer's accumulation is left as it is. Under several processes, rank 0 tunes and broadcasts.
    The result is kept as :attr:`result` (on rank 0). Each process trains under the plan's environment as far
    as a started process can be set (on the CPU, the allocator the probes ran:
    :func:`~autobatch.devices.cpu.hold_environment_here`). With ``guard=True`` (one process) the loader's batch
    is the plan's per-rank batch (micro-batch x accumulation), ``accumulate_grad_batches`` is 1 and a
    :class:`~autobatch.guard.Guard` from the result (:attr:`guard`) splits it, as :class:`Guarded` does.
    """

    def __init__(
        self,
        *,
        global_batch_size: int | None = None,
        guard: bool = False,
        batch_attr: str = "batch_size",
        on_probe: Callable[[ProbeEvent], None] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        self.global_batch_size = global_batch_size
        self.batch_attr = batch_attr
        self.on_probe = on_probe
        self.settings = settings
        self.result: TuneResult | None = None
        self.use_guard = guard
        self.guard: Guard | None = None
        self._resumed: dict[str, Any] | None = None  # the guard's state from a checkpoint (ckpt_path=)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        chosen = None
        if trainer.is_global_zero:
            self.result = self._tune(trainer, pl_module)
            assert self.result.chosen is not None  # tune() raises NothingFitsError otherwise
            picked = self.result.chosen
            chosen = (picked.micro_batch_size, picked.accumulation_steps, picked.seq_len, picked.environment)
        if trainer.world_size > 1:
            chosen = trainer.strategy.broadcast(chosen, src=0)
        assert chosen is not None
        micro, accumulation, seq_len, environment = chosen
        if not hold_environment_here(environment):  # the CPU's allocator, as the probes ran it
            logger.warning(
                "AutoBatch: the plan holds under %s, which this process could not set: start it with them",
                " ".join(f"{k}={v}" for k, v in environment.items()),
            )
        if seq_len is not None:  # tuned over lengths (seq_lens=[...]): train at the plan's
            set_length(pl_module, trainer.datamodule, seq_len)
        if self.use_guard:
            from autobatch.guard import Guard

            assert self.result is not None  # one process: rank 0 tuned
            self.guard = Guard.from_result(self.result)
            if self._resumed is not None:
                self.guard.load_state_dict(self._resumed)
            micro, accumulation = micro * accumulation, 1  # the loader's batch: the guard splits it
            trainer.accumulate_grad_batches = 1
        if not set_batch_size(pl_module, trainer.datamodule, self.batch_attr, micro):
            raise UsageError(
                f"AutoBatch found no {self.batch_attr!r} attribute or hparam on the module or the data module",
                hint="keep the batch size where Lightning's BatchSizeFinder looks for it, or pass batch_attr=",
            )
        if self.global_batch_size is not None:
            trainer.accumulate_grad_batches = accumulation
        logger.info(
            "AutoBatch: %s = %d, accumulate_grad_batches = %d%s",
            self.batch_attr,
            micro,
            trainer.accumulate_grad_batches,
            f", sequence length {seq_len}" if seq_len is not None else "",
        )
        if self.guard is not None:
            install_guard(trainer, pl_module, self.guard)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        remove_guard(pl_module)

    def state_dict(self) -> dict[str, Any]:
        """The guard's state, in Lightning's checkpoints (none before the guard exists)."""
        return {"guard": self.guard.state_dict()} if self.guard is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Kept for the guard ``on_fit_start`` builds (Lightning restores callbacks before that hook)."""
        self._resumed = state_dict.get("guard")

    def _tune(self, trainer: Any, pl_module: Any) -> TuneResult:
        from autobatch.api import callback_tune

        refuse_manual_optimization(pl_module)  # before any probe: each would refuse it after its imports

        datamodule = trainer.datamodule
        script = LightningScript(
            recipe(pl_module), recipe(datamodule) if datamodule is not None else None, self.batch_attr
        )
        implied: dict[str, tuple[Any, str]] = {
            "device": (trainer_device(trainer), "the Trainer's device"),
            "precisions": ([str(trainer.precision)], "the Trainer's precision"),
            "recompute": (False, "the Trainer (no recomputation)"),
            "world_size": (trainer.world_size, "the Trainer's world_size"),
        }
        optimizer = optimizer_name(trainer.optimizers[0]) if trainer.optimizers else None
        if optimizer is not None:
            implied["optimizers"] = ([optimizer], "configure_optimizers()")
        settings = dict(self.settings)
        if self.global_batch_size is not None:
            settings["global_batch_size"] = self.global_batch_size
        samples = train_samples(trainer, pl_module)
        if samples is not None and samples < (settings.get("max_batch_size") or samples + 1):
            # no batch is larger than the data set (Lightning's own finder stops there too)
            settings.pop("max_batch_size", None)
            implied["max_batch_size"] = (samples, f"the training data's {samples} samples per process")
        return callback_tune(script, implied, on_probe=self.on_probe, **settings)


class Guarded(Callback):
    """Run ``Trainer.fit`` under ``guard``: each loader batch is split into the guard's micro-batches, which
    lower when memory runs out (:func:`install_guard`). The loader's batch is the per-rank batch and
    ``accumulate_grad_batches`` must be 1."""

    def __init__(self, guard: Guard) -> None:
        super().__init__()
        self.guard = guard

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        install_guard(trainer, pl_module, self.guard)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        remove_guard(pl_module)

    def state_dict(self) -> dict[str, Any]:
        """The guard's state, in Lightning's checkpoints: ``fit(ckpt_path=...)`` resumes where it stood."""
        return {"guard": self.guard.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "guard" in state_dict:
            self.guard.load_state_dict(state_dict["guard"])


def install_guard(trainer: Any, pl_module: Any, guard: Guard) -> None:
    """Make ``pl_module``'s automatic optimization run each batch through ``guard``.

    Lightning's closure runs ``training_step``, then ``zero_grad``, then ``backward``. So the module's
    ``training_step`` becomes the guard's: every micro-batch's forward (the user's ``training_step`` on
    it, whose loss is a mean over its samples) and backward; it sets the gradients aside and returns the
    batch's loss, detached. The module's ``backward`` puts the gradients back. Gradient clipping, the
    optimizer step, 16-bit loss scaling (its scaler is given to the guard) and the hooks run as Lightning
    runs them. A ``training_step`` that returns a dict gives its ``"loss"``; its other keys are dropped.
    """
    problems = []
    if not pl_module.automatic_optimization:
        problems.append("the module optimizes manually (call guard.backward in its training_step instead)")
    if trainer.world_size > 1:
        problems.append(
            f"the Trainer runs {trainer.world_size} processes (the guard runs one under Lightning)"
        )
    if trainer.accumulate_grad_batches != 1:
        problems.append(f"accumulate_grad_batches is {trainer.accumulate_grad_batches}, not 1")
    if problems:
        raise UsageError(
            "the guard cannot run this fit: " + "; ".join(problems),
            hint="give the loader the per-rank batch (micro-batch x accumulation) and accumulate_grad_batches=1 "
            "on one device; docs/guard.md, Lightning",
        )
    step = pl_module.training_step
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    kept: list[tuple[Any, Any]] = []

    def loss_of(output: Any) -> Any:
        return output["loss"] if isinstance(output, Mapping) else output

    def training_step(batch: Any, batch_idx: int, *args: Any, **kwargs: Any) -> Any:
        for parameter in pl_module.parameters():
            parameter.grad = None
        loss = guard.backward(
            pl_module,
            batch,
            lambda _model, micro: loss_of(step(micro, batch_idx, *args, **kwargs)),
            scaler=scaler,
        )
        kept.clear()
        for parameter in pl_module.parameters():
            kept.append((parameter, parameter.grad))
            parameter.grad = None  # out of reach of zero_grad, which may zero in place
        return loss

    def backward(loss: Any, *args: Any, **kwargs: Any) -> None:
        for parameter, grad in kept:
            parameter.grad = grad
        kept.clear()

    pl_module.training_step = training_step
    pl_module.backward = backward


def remove_guard(pl_module: Any) -> None:
    """The module's own ``training_step`` and ``backward`` again (after ``fit``)."""
    for name in ("training_step", "backward"):
        pl_module.__dict__.pop(name, None)


def train_samples(trainer: Any, pl_module: Any) -> int | None:
    """The samples one process's training loader can hold in a batch: the training data set's length over the
    processes (None: not known, an iterable data set or loaders given to ``fit`` itself)."""
    source = trainer.datamodule if trainer.datamodule is not None else pl_module
    try:
        samples = len(source.train_dataloader().dataset)
    except Exception:  # noqa: BLE001 - the probes build the loader again and report its errors
        return None
    return max(-(-samples // trainer.world_size), 1)


def trainer_device(trainer: Any) -> str:
    """The Trainer's device as autobatch names it (``cpu``, ``cuda:N``)."""
    device = trainer.strategy.root_device
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    raise UsageError(f"AutoBatch tunes on the CPU or CUDA, not on {device}", hint="pass device= explicitly")


#: torch.optim class name -> autobatch optimizer name.
OPTIMIZER_NAMES = {
    "Adam": "adam",
    "AdamW": "adamw",
    "Adafactor": "adafactor",
    "RMSprop": "rmsprop",
    "Adagrad": "adagrad",
}


def optimizer_name(optimizer: Any) -> str | None:
    """autobatch's name for a torch optimizer (None: not one autobatch builds; the settings' is used)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # Lightning wraps it
    name = type(inner).__name__
    defaults = getattr(inner, "defaults", {})
    if name == "SGD":
        return "sgd-momentum" if defaults.get("momentum") else "sgd"
    if name == "AdamW" and defaults.get("fused"):
        return "adamw-fused"
    return OPTIMIZER_NAMES.get(name)
