"""The Lightning adapter in this process (no probe server): the three functions over a LightningModule.

Lightning is imported by the tests that use it (the ``lit`` fixture), not when the module is collected:
importing it takes seconds, and every xdist worker collects every module.
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from types import SimpleNamespace

import cloudpickle
import pytest
import torch

from autobatch.errors import ContractError, UsageError
from autobatch.step.spec import ScriptSpec

pytestmark = pytest.mark.consumers

HERE = Path(__file__).resolve().parent
APP = HERE / "lit_app.py"


@pytest.fixture(scope="module")
def lit() -> SimpleNamespace:
    """The test app (lit_app.py) and the adapter, which import lightning."""
    pytest.importorskip("lightning")
    import lit_app

    from autobatch.integrations.lightning import optimizer_name
    from autobatch.step.contract import load_spec
    from autobatch.step.lightning import LightningScript, recipe, set_batch_size

    return SimpleNamespace(
        app=lit_app, load_spec=load_spec, LightningScript=LightningScript, recipe=recipe,
        set_batch_size=set_batch_size, optimizer_name=optimizer_name,
    )  # fmt: skip


def lightning_spec(tmp_path: Path, config: str | None = None, datamodule: str = "LitData") -> ScriptSpec:
    options: dict[str, object] = {"datamodule": f"{APP}:{datamodule}", "batch_attr": "batch_size"}
    if config is not None:
        (tmp_path / "config.yaml").write_text(config)
        options["config"] = str(tmp_path / "config.yaml")
    return ScriptSpec("lightning", f"{APP}:LitMLP", options)


def test_the_step_is_training_step_on_the_first_batch_at_each_size(
    lit: SimpleNamespace, tmp_path: Path
) -> None:
    config = "model:\n  width: 16\ndata:\n  class_path: lit_app.LitData\n  init_args:\n    width: 16\n    tokens: 8\n"
    script = lit.load_spec(lightning_spec(tmp_path, config))
    model = script.build_model()
    # imported from the file, as `tune --lightning lit_app.py:LitMLP` does (its own module, not lit_app)
    assert type(model).__name__ == "LitMLP" and model.hparams.width == 16  # init arguments from the YAML
    for size in (3, 7):
        x, y = script.make_batch(size)
        assert x.shape == (size, 8, 16) and y.shape == (size,)
    loss = script.compute_loss(model, script.make_batch(5))
    assert loss.ndim == 0 and loss.requires_grad
    assert model.seen == [5]  # the module's own training_step ran (its self.log without a Trainer is ignored)


def test_the_batch_size_goes_where_lightnings_finder_sets_it(lit: SimpleNamespace) -> None:
    data = lit.app.LitData(batch_size=2)
    assert lit.set_batch_size(lit.app.LitMLP(), data, "batch_size", 9) == 2  # the attribute and the hparam
    assert data.batch_size == 9 and data.hparams.batch_size == 9


def test_a_data_module_without_a_batch_size_is_named(lit: SimpleNamespace, tmp_path: Path) -> None:
    script = lit.load_spec(lightning_spec(tmp_path, datamodule="NoBatchSize"))
    script.build_model()
    with pytest.raises(ContractError, match="'batch_size' attribute or hparam"):
        script.make_batch(8)


def test_a_dataset_smaller_than_the_batch_is_refused(lit: SimpleNamespace, tmp_path: Path) -> None:
    script = lit.load_spec(lightning_spec(tmp_path, "data:\n  samples: 10\n  tokens: 4\n"))
    script.build_model()
    with pytest.raises(ContractError, match="holds 10 samples, but the batch size was set to 16"):
        script.make_batch(16)


def test_manual_optimization_is_refused(lit: SimpleNamespace) -> None:
    with pytest.raises(ContractError, match="manual optimization"):
        lit.LightningScript(lit.app.ManualStep).build_model()


def test_a_class_that_is_not_a_lightning_module_is_a_usage_error(
    lit: SimpleNamespace, tmp_path: Path
) -> None:
    spec = ScriptSpec("lightning", f"{APP}:Block", {})
    with pytest.raises(UsageError, match="not a LightningModule subclass"):
        lit.load_spec(spec)


def test_recipes_rebuild_from_hparams_or_a_pickled_copy(lit: SimpleNamespace) -> None:
    module = lit.app.LitMLP(width=8)
    built = lit.recipe(module)
    assert isinstance(built, functools.partial) and built().hparams.width == 8  # save_hyperparameters
    assert isinstance(
        lit.recipe(lit.app.NoBatchSize()), functools.partial
    )  # needs no init arguments: the class
    odd = lit.app.Holder(torch.arange(3))  # no hparams cover its arguments: the object itself is copied
    copy = pickle.loads(cloudpickle.dumps(lit.recipe(odd)))()
    assert isinstance(copy, lit.app.Holder) and copy.values.tolist() == [0, 1, 2] and copy is not odd


def test_optimizer_names_follow_the_configured_optimizer(lit: SimpleNamespace) -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert lit.optimizer_name(torch.optim.AdamW(params)) == "adamw"
    assert lit.optimizer_name(torch.optim.SGD(params, lr=0.1, momentum=0.9)) == "sgd-momentum"
    assert lit.optimizer_name(torch.optim.SGD(params, lr=0.1)) == "sgd"
    assert lit.optimizer_name(torch.optim.LBFGS(params)) is None
