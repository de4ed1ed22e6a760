"""make_batch(batch_size, seq_len): the optional second parameter, and the check that a batch follows it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support import SCRIPTS, run_cli

from autobatch.errors import EXIT_USAGE, ContractError
from autobatch.settings import load_settings
from autobatch.step.as_is import AsIsScript, substitute
from autobatch.step.contract import check_batch, user_script


class OneShape:
    @staticmethod
    def build_model() -> torch.nn.Module:
        return torch.nn.Linear(4, 4)

    @staticmethod
    def make_batch(batch_size: int) -> torch.Tensor:
        return torch.zeros(batch_size, 16)

    @staticmethod
    def compute_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return model(batch).sum()


class Lengths(OneShape):
    @staticmethod
    def make_batch(batch_size: int, seq_len: int = 16) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {
            "tokens": torch.zeros(batch_size, seq_len, dtype=torch.long),
            "label": torch.zeros(batch_size),
        }


def test_a_length_reaches_a_make_batch_that_takes_one() -> None:
    script = user_script(Lengths, "lengths.py", Path("lengths.py"))
    assert script.takes_seq_len
    assert script.batch(3, 64)["tokens"].shape == (3, 64)
    assert script.batch(3)["tokens"].shape == (3, 16)  # its own default: one shape


def test_a_make_batch_of_one_parameter_is_told_how_to_take_a_length() -> None:
    script = user_script(OneShape, "one.py", Path("one.py"))
    assert not script.takes_seq_len and script.batch(2).shape == (2, 16)
    with pytest.raises(ContractError, match="asks for sequences of 64 tokens") as caught:
        script.batch(2, 64)
    assert "def make_batch(batch_size, seq_len" in (caught.value.hint or "")


def test_a_batch_that_ignores_its_length_is_caught_unless_the_check_is_off() -> None:
    batch = {"tokens": torch.zeros(4, 32), "label": torch.zeros(4)}
    check_batch(batch, 4, seq_len=32)
    with pytest.raises(ContractError, match=r"make_batch\(4, 64\) returned no tensor with 64 in its second"):
        check_batch(batch, 4, seq_len=64)
    check_batch(batch, 4, check_size=False, seq_len=64)


def test_lengths_come_from_the_toml_the_environment_and_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "autobatch.toml"
    config.write_text("[search]\nseq_lens = [512, 128, 512]\n[plan]\nseq_len = 256\n")
    settings = load_settings(config=config)
    assert settings.search.seq_lens == (512, 128) and settings.plan.seq_len == 256
    monkeypatch.setenv("AUTOBATCH_SEQ_LENS", "64, 128")
    assert load_settings(config=config).search.seq_lens == (64, 128)


def test_a_script_run_as_it_is_gets_its_length_in_its_arguments() -> None:
    args = ["--bs", "{batch}", "--max-len={seq_len}", "--accum", "{accum}"]
    assert substitute(args, 8, 2, seq_len=512) == ["--bs", "8", "--max-len=512", "--accum", "2"]
    assert substitute(args, 8) == ["--bs", "8", "--max-len={seq_len}", "--accum", "1"]


def test_a_script_run_as_it_is_gets_its_length_in_its_environment() -> None:
    script = AsIsScript(Path("train.py"), (), "BS", {}, "SEQ_LEN")
    assert script.environment(8, 512) == {
        "AUTOBATCH_BATCH_SIZE": "8", "BS": "8", "AUTOBATCH_SEQ_LENGTH": "512", "SEQ_LEN": "512"
    }  # fmt: skip
    assert script.environment(8) == {"AUTOBATCH_BATCH_SIZE": "8", "BS": "8"}  # no length tuned: none set
    spec = {"target": "train.py", "options": {"batch_env": None, "seq_len_env": "MAX_LEN"}}
    assert AsIsScript.from_spec(spec, ["--config", "c.yaml"]).environment(2, 64)["MAX_LEN"] == "64"


AS_IS = str(SCRIPTS / "as_is" / "config_seq_len.py")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        # lengths with no way into the script: the fix names both ways
        (
            ("--seq-len", "64"),
            ["nothing passes them to the script", "--seq-len-env SEQ_LEN", "AUTOBATCH_SEQ_LENGTH"],
        ),
        # a variable no length would set
        (("--seq-len-env", "SEQ_LEN"), ["no length is tuned", "--seq-len 512 --seq-len 2048"]),
        (
            ("--seq-len", "64", "--seq-len-env", "SEQ LEN"),
            ["--seq-len-env 'SEQ LEN' is not an environment variable"],
        ),
    ],
)
def test_how_a_length_reaches_a_script_run_as_it_is_is_checked_before_any_probe(
    tmp_path: Path, flags: tuple[str, ...], said: list[str]
) -> None:
    proc = run_cli(
        "tune", AS_IS, "--device", "cpu", "--memory", "512MiB", "--batch-env", "BATCH_SIZE", *flags, "--no-cache",
        "--", "--config", "config.yaml", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == EXIT_USAGE and "Traceback" not in proc.stderr, proc.stderr
    assert all(words in proc.stderr for words in said), proc.stderr
