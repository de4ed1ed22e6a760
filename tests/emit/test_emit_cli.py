"""``autobatch emit RESULT_FILE --format FORMAT[=PATH]``: through Typer's CliRunner and as the real command."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from emit_cases import BY_NAME, DATA
from typer.testing import CliRunner

from autobatch.cli.root import app  # every command registered (with one, Typer takes "emit" for RESULT_FILE)
from autobatch.errors import UsageError
from autobatch.records.result import TuneResult

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def result_file(tmp_path: Path) -> Path:
    path = tmp_path / "autobatch-result.json"
    path.write_text(BY_NAME["bf16-mixed_accum_w4"].result().to_json())
    return path


def invoke(*args: str, cwd: Path) -> object:
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, ["emit", *args])
    finally:
        os.chdir(old)


def test_writes_default_files_and_lists_them(tmp_path: Path, result_file: Path) -> None:
    out = invoke(result_file.name, "--format", "deepspeed", "--format", "env", cwd=tmp_path)
    assert out.exit_code == 0, out.output  # type: ignore[attr-defined]
    ds = json.loads((tmp_path / "ds_config.json").read_text())
    assert (
        ds["train_batch_size"],
        ds["train_micro_batch_size_per_gpu"],
        ds["gradient_accumulation_steps"],
    ) == (240, 12, 5)
    env_text = (tmp_path / "autobatch.env").read_text()
    assert "# command: autobatch emit autobatch-result.json --format deepspeed --format env\n" in env_text
    assert "export AUTOBATCH_MICRO_BATCH_SIZE=12" in env_text
    stderr = out.stderr  # type: ignore[attr-defined]
    assert "micro-batch 12 x accumulation 5 x world 4 = global 240 (requested 240)" in stderr
    assert "wrote ds_config.json (deepspeed)" in stderr and "wrote autobatch.env (env)" in stderr
    assert "note: no optimizer section" in stderr and "optimizer" not in ds
    assert out.stdout == ""  # type: ignore[attr-defined]


def test_format_equals_path_and_json_listing(tmp_path: Path, result_file: Path) -> None:
    out = invoke(str(result_file), "-f", "hf=cfg/args.json", "-f", "toml=cfg/r.toml", "--json", cwd=tmp_path)
    assert out.exit_code == 0, out.output  # type: ignore[attr-defined]
    listing = json.loads(out.stdout)  # type: ignore[attr-defined]
    assert listing == {
        "written": [{"format": "hf", "path": "cfg/args.json"}, {"format": "toml", "path": "cfg/r.toml"}]
    }
    assert json.loads((tmp_path / "cfg" / "args.json").read_text())["per_device_train_batch_size"] == 12


def test_output_and_base_and_batch_key(tmp_path: Path, result_file: Path) -> None:
    out = invoke(
        str(result_file),
        "--format",
        "deepspeed",
        "--output",
        "ds.json",
        "--base",
        str(DATA / "ds_base_zero2.json"),
        cwd=tmp_path,
    )
    assert out.exit_code == 0, out.output  # type: ignore[attr-defined]
    ds = json.loads((tmp_path / "ds.json").read_text())
    assert ds["zero_optimization"]["stage"] == 2 and ds["train_batch_size"] == 240
    out = invoke(
        str(result_file),
        "--format",
        "lightning",
        "--lightning-batch-key",
        "data.init_args.batch_size",
        cwd=tmp_path,
    )
    assert out.exit_code == 0, out.output  # type: ignore[attr-defined]
    assert "    batch_size: 12" in (tmp_path / "lightning_overlay.yaml").read_text()


#: DeepSpeed's own examples' optimizer: its "Adam" is AdamW (adam_w_mode defaults to true), the algorithm the
#: result's adamw is; it was taken for another type and replaced by an AdamW without its betas and eps, silently.
ADAM_BASE = {"optimizer": {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8}}}


@pytest.mark.parametrize(
    ("base", "optimizer", "note"),
    [
        (ADAM_BASE, ADAM_BASE["optimizer"], None),
        (
            {"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": True}}},
            {"type": "AdamW", "params": {"lr": 0.1}},
            "the base config's optimizer SGD is replaced by AdamW, the one tuned, without its momentum, nesterov",
        ),
    ],
)
def test_a_base_optimizer_keeps_its_params_or_names_those_left_out(
    tmp_path: Path, result_file: Path, base: dict, optimizer: dict, note: str | None
) -> None:
    (tmp_path / "base.json").write_text(json.dumps(base))
    out = invoke(result_file.name, "--format", "deepspeed", "--base", "base.json", cwd=tmp_path)
    assert out.exit_code == 0, out.output  # type: ignore[attr-defined]
    assert json.loads((tmp_path / "ds_config.json").read_text())["optimizer"] == optimizer
    stderr = out.stderr  # type: ignore[attr-defined]
    assert (note in stderr) if note else ("base config's optimizer" not in stderr), stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "deepspeeed"], "did you mean 'deepspeed'"),
        (["--format", "hf", "--format", "env", "--output", "x"], "--output applies to exactly one --format"),
        (["--format", "hf", "--base", "ds.json"], "--base is the DeepSpeed config"),
        (["--format", "deepspeed", "--base", "missing.json"], "cannot read the DeepSpeed base config"),
        (["--format", "lightning", "--lightning-batch-key", "data..x"], "not a dotted key"),
    ],
)
def test_usage_errors(tmp_path: Path, result_file: Path, args: list[str], message: str) -> None:
    out = invoke(str(result_file), *args, cwd=tmp_path)
    assert isinstance(out.exception, UsageError)  # type: ignore[attr-defined]
    assert message in out.exception.message  # type: ignore[attr-defined]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autobatch-result.json"]


def test_missing_result_file(tmp_path: Path) -> None:
    out = invoke(str(tmp_path / "nope.json"), "--format", "env", cwd=tmp_path)
    assert isinstance(out.exception, UsageError) and "no result file" in out.exception.message  # type: ignore[attr-defined]


def test_nothing_fits(tmp_path: Path) -> None:
    result = BY_NAME["32-true_accum_w1"].result()
    result.chosen = None
    for combo in result.combinations:
        combo.status, combo.max_batch_size = "infeasible", None
    path = tmp_path / "r.json"
    path.write_text(result.to_json())
    out = invoke(str(path), "--format", "env", cwd=tmp_path)
    assert isinstance(out.exception, UsageError)
    assert out.exception.message.startswith("no configuration to emit: no combination fits")  # type: ignore[attr-defined]
    out = invoke(str(path), "--format", "toml", cwd=tmp_path)
    assert out.exit_code == 0  # type: ignore[attr-defined]
    assert TuneResult.load(path) == result


@pytest.mark.parametrize(
    ("status", "pid", "said"),
    [
        ("running", "live", "still running"),
        ("running", "dead", "was killed before it finished"),
        ("running", None, "had not finished"),
        ("interrupted", None, "was interrupted"),
        ("failed", None, "failed before it chose"),
    ],
)
def test_an_unfinished_tune_is_named_not_called_nothing_fits(
    tmp_path: Path, status: str, pid: str | None, said: str
) -> None:
    """A result file of a tune that has not chosen yet (still running, killed, interrupted, failed)
    emits no launcher config and says why, with how to resume; the whole-result formats still write."""
    result = BY_NAME["32-true_accum_w1"].result()
    result.chosen, result.status = None, status
    if pid is not None:
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        result.pid = os.getpid() if pid == "live" else gone.pid
        result.host = socket.gethostname()
        result.created = datetime.datetime.now(datetime.timezone.utc).isoformat()  # after our own start
    path = tmp_path / "r.json"
    path.write_text(result.to_json())
    out = invoke(str(path), "--format", "env", cwd=tmp_path)
    error = out.exception  # type: ignore[attr-defined]
    assert isinstance(error, UsageError) and said in error.message and "nothing fits" not in error.message
    assert "resumes from the probes" in (error.hint or "")
    out = invoke(str(path), "--format", "json=partial.json", cwd=tmp_path)
    assert out.exit_code == 0 and "partial result" in out.output  # type: ignore[attr-defined]


def _wired() -> bool:
    proc = subprocess.run(
        [sys.executable, "-m", "autobatch", "emit", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    return proc.returncode == 0


def test_real_command_exit_codes(tmp_path: Path, result_file: Path) -> None:
    """The installed command: success, then a usage error printed as error/hint with exit code 2."""
    if not _wired():
        pytest.skip("`autobatch emit` is not registered in autobatch/cli/__init__.py yet")
    env = {**os.environ, "NO_COLOR": "1"}
    ok = subprocess.run([sys.executable, "-m", "autobatch", "emit", str(result_file), "--format", "accelerate"],
                        capture_output=True, text=True, cwd=tmp_path, env=env)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "mixed_precision: bf16" in (tmp_path / "accelerate_config.yaml").read_text()
    bad = subprocess.run([sys.executable, "-m", "autobatch", "emit", str(result_file), "--format", "yaml"],
                         capture_output=True, text=True, cwd=tmp_path, env=env)  # fmt: skip
    assert bad.returncode == 2
    assert "error: unknown emit format 'yaml'" in bad.stderr and "hint: use one of deepspeed" in bad.stderr
