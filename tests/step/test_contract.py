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
