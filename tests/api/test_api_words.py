"""What a notebook's ``autobatch.check()`` tells of a step that fails: the fixes a probe, the probe client or the
translation of an outcome write name their levers in the neutral form, and the API renders them as keywords
(``memory=``, ``timeout=``) and points to the error's ``.detail`` where the command says ``--verbose``; a keyword
of ``check`` itself (``optimizer=``) is named as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import SCRIPTS

import autobatch
from autobatch.errors import ConfigError, ScriptError


def flags(text: str) -> list[str]:
    """The command-line flags a text names outside a quoted command."""
    return re.findall(r"(?<![\w-])--[a-z][a-z-]*", re.sub(r"`[^`]*`", "", text))


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


@pytest.mark.slow  # one probe server
def test_a_script_error_points_to_the_errors_detail_not_to_a_flag() -> None:
    with pytest.raises(ScriptError) as raised:  # its make_batch refuses batches above its 64 samples
        autobatch.check(str(SCRIPTS / "value_error.py"), batch_size=65, device="cpu", memory="600MiB")
    error = raised.value
    assert "read the error's .detail for the traceback" in str(error.hint)
    assert flags(f"{error.message} {error.hint}") == [], error.hint
    assert "exceeds the dataset's 64 samples" in str(error.detail)


def test_checks_own_keywords_are_named_as_written() -> None:
    with pytest.raises(ConfigError) as raised:
        autobatch.check(str(SCRIPTS / "value_error.py"), batch_size=8, optimizer="sgdd", precision="bf61")
    assert 'optimizer="sgdd": expected' in raised.value.message, raised.value.message
    assert 'precision="bf61": expected' in raised.value.message
    assert "optimizers=" not in raised.value.message and "precisions=" not in raised.value.message


@pytest.mark.parametrize("batch_size", [0, "8"])
def test_a_batch_size_that_is_no_count_is_refused_before_any_probe(batch_size: object) -> None:
    """A batch of 0 was probed, and its NaN loss reported as the step's broken contract."""
    from autobatch.errors import UsageError

    with pytest.raises(UsageError) as refused:
        autobatch.check(str(SCRIPTS / "value_error.py"), batch_size=batch_size, device="cpu", memory="600MiB")
    assert f"batch_size={batch_size!r}".replace("'", '"') in refused.value.message, refused.value.message


@pytest.mark.slow  # one probe server
def test_a_make_batch_that_ignores_its_size_is_told_the_keyword_that_turns_the_check_off() -> None:
    def build_model() -> object:
        import torch

        return torch.nn.Linear(8, 2)

    def make_batch(batch_size: int) -> object:
        import torch

        return torch.randn(4, 8)  # the size of the first experiment, left behind

    def compute_loss(model: object, batch: object) -> object:
        return model(batch).sum()  # type: ignore[operator]

    from autobatch.errors import ContractError

    with pytest.raises(ContractError) as refused:
        autobatch.check(build_model=build_model, make_batch=make_batch, compute_loss=compute_loss, batch_size=8,
                        device="cpu", memory="600MiB")  # fmt: skip
    assert "or check_batch_size=False" in str(refused.value.hint), refused.value.hint
    assert flags(str(refused.value.hint)) == []
