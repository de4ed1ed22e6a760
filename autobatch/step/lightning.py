"""Lightning: a LightningModule as the training step (``tune --lightning``), and the ``AutoBatch`` callback.

:class:`LightningScript` is the three-function contract over a LightningModule and, optionally, a
LightningDataModule (``build_model`` after ``configure_model()``, ``make_batch`` by setting the batch size
where Lightning's ``BatchSizeFinder`` sets it, ``compute_loss`` as ``training_step`` without a Trainer).
:class:`AutoBatch` tunes when ``Trainer.fit`` starts and trains with the result. Details: docs/lightning.md.
"""

from __future__ import annotations

import functools
import inspect
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from lightning.pytorch import LightningDataModule, LightningModule

from autobatch.errors import ContractError, UsageError
from autobatch.settings.levers import neutral
from autobatch.step.identity import Identified, step_identity
from autobatch.step.importing import import_reference
from autobatch.step.lightning_yaml import init_arguments, instantiate

if TYPE_CHECKING:
    pass

logger = logging.getLogger("autobatch")


class LightningScript:
    """``build_model``, ``make_batch`` and ``compute_loss`` over a LightningModule (and a data module)."""

    def __init__(
        self,
        make_module: Callable[[], Any],
        make_datamodule: Callable[[], Any] | None = None,
        batch_attr: str = "batch_size",
    ) -> None:
        self.make_module = make_module
        self.make_datamodule = make_datamodule
        self.batch_attr = batch_attr
        self._module: Any = None
        self._datamodule: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_module": None, "_datamodule": None}  # ship the recipes, never instances

    def build_model(self) -> Any:
        module = self.make_module()
        refuse_manual_optimization(module)
        module.configure_model()
        self._module = module
        return module

    def make_batch(self, batch_size: int, seq_len: int | None = None) -> Any:
        module = self._module if self._module is not None else self.make_module()
        datamodule = self._datamodule_instance()
        if seq_len is not None:
            set_length(module, datamodule, seq_len)
        if not set_batch_size(module, datamodule, self.batch_attr, batch_size):
            raise ContractError(
                f"neither {type(module).__name__} nor "
                f"{type(datamodule).__name__ if datamodule is not None else 'a data module'} has a "
                f"{self.batch_attr!r} attribute or hparam to set the batch size with",
                hint="keep the batch size where Lightning's BatchSizeFinder looks for it (self.batch_size or "
                "save_hyperparameters() in the module or the data module), or name it with "
                f"{neutral('lightning_batch_key')}",
            )
        if datamodule is not None:
            datamodule.prepare_data()
            datamodule.setup("fit")
        source = datamodule if datamodule is not None else module
        batch = next(iter(source.train_dataloader()))
        got = _leading(batch)
        if got is not None and got != batch_size:
            raise ContractError(
                f"the first batch of train_dataloader() holds {got} samples, but the batch size was set to "
                f"{batch_size} ({self.batch_attr!r})",
                hint="the dataloader must read the batch size from that attribute, and the dataset must hold "
                f"a full batch of the largest size searched (or lower {neutral('max_batch_size')})",
            )
        return batch

    def _datamodule_instance(self) -> Any:
        if self._datamodule is None and self.make_datamodule is not None:
            self._datamodule = self.make_datamodule()
        return self._datamodule

    def compute_loss(self, model: Any, batch: Any) -> Any:
        step = model.training_step
        takes_index = _positional(step) >= 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # self.log() without a Trainer warns, and does nothing
            try:
                out = step(batch, 0) if takes_index else step(batch)
            except RuntimeError as exc:
                if "not attached to a `Trainer`" not in str(exc):
                    raise
                raise ContractError(
                    f"{type(model).__name__}.training_step needs self.trainer: {exc}",
                    hint="autobatch runs training_step without a Trainer; keep Trainer access out of it",
                ) from None
        loss = out.get("loss") if isinstance(out, Mapping) else out
        if loss is None:
            raise ContractError(
                f"{type(model).__name__}.training_step returned {'a dict without loss' if out else 'None'}",
                hint="return the loss (or a dict with 'loss') from training_step for every batch",
            )
        return loss


#: Where a module or data module keeps its sequence length, in the order they are tried (``--seq-len``).
LENGTH_ATTRS = ("seq_len", "max_seq_len", "seq_length", "max_length", "block_size")


def set_length(module: Any, datamodule: Any, seq_len: int) -> None:
    """Set the sequence length where the module or the data module keeps it (see :data:`LENGTH_ATTRS`)."""
    if not any(set_batch_size(module, datamodule, name, seq_len) for name in LENGTH_ATTRS):
        raise ContractError(
            f"sequence length {seq_len} ({neutral('seq_lens', [seq_len])}): neither the module nor the data module has an attribute or hparam named "
            f"{', '.join(LENGTH_ATTRS)} to set the sequence length with",
            hint="keep the length in self.seq_len (or save_hyperparameters()) and have train_dataloader() read it",
        )


def _leading(batch: Any) -> int | None:
    """The leading size of the first tensor in a batch (tensors, or nested tuples/lists/dicts of them)."""
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    items = (
        batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    )
    for item in items:
        found = _leading(item)
        if found is not None:
            return found
    return None


def _positional(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def attr_holders(obj: Any, attr: str) -> list[Any]:
    """Where Lightning's finder would set ``attr`` on ``obj``: the object, and its hparams when they hold it."""
    holders: list[Any] = []
    if obj is None:
        return holders
    if hasattr(obj, attr):
        holders.append(obj)
    hparams = getattr(obj, "hparams", None)
    if isinstance(hparams, Mapping) and attr in hparams:
        holders.append(hparams)
    return holders


def set_batch_size(module: Any, datamodule: Any, attr: str, value: int) -> int:
    """Set ``attr`` to ``value`` everywhere Lightning's finder would; returns in how many places."""
    holders = attr_holders(module, attr) + attr_holders(datamodule, attr)
    for holder in holders:
        if isinstance(holder, dict):
            holder[attr] = value
        else:
            setattr(holder, attr, value)
    return len(holders)


# -- tune --lightning: classes and init arguments named on the command line -----------------------------


def from_targets(
    target: str, datamodule: str | None = None, config: str | None = None, batch_attr: str = "batch_size"
) -> LightningScript:
    """The step of ``--lightning PATH:Class [--datamodule PATH:Class] [--lightning-config YAML]``."""
    module_cls = import_reference(target, "--lightning")
    _require_subclass(module_cls, LightningModule, "--lightning", target)
    data_cls = import_reference(datamodule, "--datamodule") if datamodule else None
    if data_cls is not None:
        _require_subclass(data_cls, LightningDataModule, "--datamodule", str(datamodule))
    model_args, data_args = init_arguments(config) if config else ({}, {})
    return LightningScript(
        functools.partial(instantiate, module_cls, model_args),
        functools.partial(instantiate, data_cls, data_args) if data_cls is not None else None,
        batch_attr,
    )


def _require_subclass(cls: Any, base: type, flag: str, target: str) -> None:
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise UsageError(
            f"{flag} {target} is not a {base.__name__} subclass", hint=f"name the class: {flag} PATH:Class"
        )


def recipe(obj: Any) -> Callable[[], Any]:
    """How a probe process builds a fresh copy of ``obj`` (a module or a data module).

    Its class with the init arguments ``save_hyperparameters()`` recorded when they cover the
    signature; the class alone when it needs none; otherwise a pickled copy of the object as it is now.
    """
    cls: Callable[..., Any] = type(obj)
    hparams = dict(getattr(obj, "hparams_initial", None) or {})
    if _covers(type(obj), hparams):
        return functools.partial(cls, **hparams)
    return _Copy(obj)


def _covers(cls: type, kwargs: Mapping[str, Any]) -> bool:
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return False
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    required = {
        p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    return required <= set(kwargs) and (takes_any or set(kwargs) <= named)


class _Copy(Identified):
    """A pickled copy of an object, unpickled afresh in each probe process (``trainer`` left behind). Its
    identity is the object without its tensors' contents: a module built without ``save_hyperparameters()``
    travels with its weights, initialised at random in each run, and the cache would miss at every run."""

    def __init__(self, obj: Any) -> None:
        import cloudpickle

        trainer = obj.__dict__.get("trainer")
        if trainer is not None:
            obj.trainer = None
        try:
            self.payload = cloudpickle.dumps(obj)
            self.identity = step_identity(obj, values=False)
        finally:
            if trainer is not None:
                obj.trainer = trainer

    def __call__(self) -> Any:
        import pickle

        return pickle.loads(self.payload)


def refuse_manual_optimization(module: Any) -> None:
    """A module that steps its optimizers itself (``automatic_optimization = False``, a GAN's two) cannot be
    tuned through its recipe, whose probes run the optimizer step: a :class:`ContractError` that points to the
    training script run as it is (its own steps are seen whoever calls them). The callback asks before any
    probe, the probe's build again."""
    if getattr(module, "automatic_optimization", True) is False:
        raise ContractError(
            f"{type(module).__name__} uses manual optimization (automatic_optimization = False): its "
            "training_step steps the optimizers itself, and a tune through the module runs the optimizer step",
            hint="tune the training script as it is, which sees its own optimizer steps: autobatch tune train.py "
            "-- --batch-size {batch} (docs/as-is.md)",
        )
