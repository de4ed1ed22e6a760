"""Lightning, for training with autobatch: the :class:`AutoBatch` callback.

It tunes in isolated probes when ``Trainer.fit`` starts (``on_fit_start``, where Lightning's
``BatchSizeFinder`` runs), through the same service as ``autobatch tune``, and trains with the result:
the batch size set where Lightning's finder sets it and, when a ``global_batch_size`` is asked for,
``trainer.accumulate_grad_batches``. (The adapter that runs a LightningModule as the step, for
``tune --lightning``, is :mod:`autobatch.step.lightning`.)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from lightning.pytorch import Callback

from autobatch.errors import UsageError
from autobatch.step.lightning import LightningScript, recipe, set_batch_size, set_length

if TYPE_CHECKING:
    from autobatch.api import ProbeEvent
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
    The result is kept as :attr:`result` (on rank 0).
    """

    def __init__(
        self,
        *,
        global_batch_size: int | None = None,
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

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        chosen = None
        if trainer.is_global_zero:
            self.result = self._tune(trainer, pl_module)
            assert self.result.chosen is not None  # tune() raises NothingFitsError otherwise
            picked = self.result.chosen
            chosen = (picked.micro_batch_size, picked.accumulation_steps, picked.seq_len)
        if trainer.world_size > 1:
            chosen = trainer.strategy.broadcast(chosen, src=0)
        assert chosen is not None
        micro, accumulation, seq_len = chosen
        if seq_len is not None:  # tuned over lengths (seq_lens=[...]): train at the plan's
            set_length(pl_module, trainer.datamodule, seq_len)
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

    def _tune(self, trainer: Any, pl_module: Any) -> TuneResult:
        from autobatch.api import tune

        datamodule = trainer.datamodule
        script = LightningScript(
            recipe(pl_module), recipe(datamodule) if datamodule is not None else None, self.batch_attr
        )
        defaults: dict[str, Any] = {
            "device": trainer_device(trainer),
            "precisions": [str(trainer.precision)],
            "recompute": False,
            "world_size": trainer.world_size,
        }
        optimizer = optimizer_name(trainer.optimizers[0]) if trainer.optimizers else None
        if optimizer is not None:
            defaults["optimizers"] = [optimizer]
        if self.global_batch_size is not None:
            defaults["global_batch_size"] = self.global_batch_size
        return tune(script, on_probe=self.on_probe, **{**defaults, **self.settings})


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
