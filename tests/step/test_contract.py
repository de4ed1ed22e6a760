"""The user contract's checks of what make_batch returns (issue #10: a make_batch that ignores its size)."""

from __future__ import annotations

import pytest
import torch

from autobatch.errors import ContractError
from autobatch.settings import load_settings
from autobatch.step.contract import check_batch


def test_a_batch_that_ignores_its_size_is_a_contract_error() -> None:
    batch = (torch.zeros(7, 784), torch.zeros(7, dtype=torch.long))
    with pytest.raises(ContractError) as info:
        check_batch(batch, 64)
    assert "leading dimension is not 64" in info.value.message
    assert "(7, 784)" in info.value.message
    assert "check_batch_size = false" in (info.value.hint or "")


def test_nested_batches_name_the_tensor_that_is_wrong() -> None:
    batch = {"x": torch.zeros(4, 3), "y": [torch.zeros(4), torch.zeros(5)]}
    with pytest.raises(ContractError, match=r"\['y'\]\[1\] has shape \(5,\)"):
        check_batch(batch, 4)


def test_a_right_batch_and_scalars_pass() -> None:
    check_batch({"x": torch.zeros(4, 3), "temperature": torch.tensor(0.5)}, 4)


def test_the_check_can_be_turned_off_for_other_layouts() -> None:
    check_batch(torch.zeros(128, 4), 4, check_size=False)  # sequence-first, say
    with pytest.raises(ContractError, match="no tensors"):
        check_batch([1, 2], 4, check_size=False)


@pytest.mark.parametrize(("env", "expected"), [("0", False), ("off", False), ("1", True)])
def test_the_opt_out_setting_reads_the_environment(
    env: str, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOBATCH_CHECK_BATCH_SIZE", env)
    assert load_settings(config=None, overrides={}).script.check_batch_size is expected


def test_tensors_on_the_meta_device_are_refused_even_with_the_size_check_off() -> None:
    batch = {"x": torch.empty(4, 3, device="meta"), "y": torch.zeros(4)}
    with pytest.raises(ContractError, match=r"returned tensors on the meta device \(batch\['x'\]\)") as info:
        check_batch(batch, 4, check_size=False)
    assert "must return real tensors" in (info.value.hint or "")


def test_fake_tensors_are_not_meta_tensors() -> None:
    """Under explain's FakeTensorMode every tensor is fake, on the device it stands for: still a batch."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        check_batch((torch.randn(4, 3), torch.zeros(4, dtype=torch.long)), 4)


def test_a_model_on_the_meta_device_is_refused() -> None:
    from autobatch.step.contract import check_model

    with torch.device("meta"):
        model = torch.nn.Linear(3, 2)
    with pytest.raises(ContractError, match="whose parameters are on the meta device") as info:
        check_model(model)
    assert "to_empty" in (info.value.hint or "")
