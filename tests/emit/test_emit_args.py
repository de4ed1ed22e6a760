"""A script tuned as it is: the job's command line (the args format, the env format's AUTOBATCH_COMMAND),
and the launcher files that leave the script's own precision and optimizer alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from emit_cases import OPTIONS, Case

from autobatch.emit import caveats, emit, render
from autobatch.emit import env as env_format
from autobatch.emit.args import command
from autobatch.errors import UsageError
from autobatch.records.result import TuneResult
from autobatch.records.schema import check_result


def _as_is(
    args: list[str], micro: int = 48, accumulation: int = 1, world: int = 1, batch_env: str | None = None
) -> TuneResult:
    result = Case("as_is", "script", "script", False, micro, accumulation, world, None, device="cpu").result()
    result.script, result.script_args = "train.py", args
    result.as_is = {"batch_env": batch_env}
    if world > 1:
        assert result.chosen is not None
        result.chosen = replace(result.chosen, strategy="ddp", nproc_per_node=world, num_nodes=1)
    return result


def test_the_placeholder_is_filled_in() -> None:
    result = _as_is(["--batch-size", "{batch}", "--name", "a b"])
    assert command(result) == ["python", "train.py", "--batch-size", "48", "--name", "a b"]
    text = render(result, "args", OPTIONS)
    assert text.splitlines()[-1] == "python train.py --batch-size 48 --name 'a b'"
    assert all(line.startswith("#") for line in text.splitlines()[:-1])


def test_the_batch_variable_and_accumulation_are_filled_in() -> None:
    result = _as_is(["--accum={accum}"], micro=32, accumulation=4, batch_env="BATCH")
    assert command(result) == ["BATCH=32", "python", "train.py", "--accum=4"]
    assert caveats(result, "args", OPTIONS) == []


def test_the_length_variable_carries_the_plans_length() -> None:
    result = _as_is(["--config", "c.yaml"], micro=32, batch_env="BATCH")
    assert result.chosen is not None and result.as_is is not None
    result.chosen = replace(result.chosen, seq_len=2048)
    result.as_is["seq_len_env"] = "SEQ_LEN"
    assert command(result) == ["BATCH=32", "SEQ_LEN=2048", "python", "train.py", "--config", "c.yaml"]
    result.chosen = replace(result.chosen, seq_len=None)  # tuned at one shape: no length to carry
    assert command(result) == ["BATCH=32", "python", "train.py", "--config", "c.yaml"]


def test_accumulation_without_a_placeholder_is_a_caveat() -> None:
    result = _as_is(["--bs", "{batch}"], accumulation=3)
    (caveat,) = caveats(result, "args", OPTIONS)
    assert "accumulates 3 micro-batches" in caveat and "{accum}" in caveat
    assert "accumulates 3 micro-batches" in render(result, "args", OPTIONS)  # in its comments (wrapped)


#: torchrun, run by the interpreter: ``python`` for a result that does not record the tune's.
TORCHRUN = ["python", "-m", "torch.distributed.run"]


def test_ranks_run_under_torchrun() -> None:
    result = _as_is(["--batch-size", "{batch}"], micro=16, world=2)
    assert command(result) == [*TORCHRUN, "--nproc-per-node=2", "train.py", "--batch-size", "16"]


def test_a_world_measured_in_one_process_is_launched_as_the_planned_world() -> None:
    """A plan for WORLD_SIZE=2 measured in one process (no strategy): torchrun starts the 2 processes the global
    batch is planned for, also from a record of before (1 process per node x 1 node), with a caveat."""
    result = _as_is(["--batch-size", "{batch}"], micro=16, accumulation=2)
    assert result.chosen is not None
    result.chosen = replace(result.chosen, world_size=2, global_batch_size=64)
    assert command(result) == [*TORCHRUN, "--nproc-per-node=2", "train.py", "--batch-size", "16"]
    world, accumulation = caveats(result, "args", OPTIONS)
    assert (
        "a world of 2 processes" in world and "measured in one" in world and "accumulates 2" in accumulation
    )
    result.chosen = replace(result.chosen, world_size=8, nproc_per_node=4, num_nodes=2, strategy="ddp")
    assert command(result)[:5] == [*TORCHRUN, "--nproc-per-node=4", "--nnodes=2"]  # type: ignore[index]


def test_a_three_function_result_has_no_command_line() -> None:
    result = Case("plain", "32-true", "adamw", False, 8, 1, 1, None, device="cpu").result()
    assert command(result) is None
    with pytest.raises(UsageError, match="script tuned as it is"):
        render(result, "args", OPTIONS)
    assert "AUTOBATCH_COMMAND" not in env_format.variables(result)


def test_the_env_file_exports_the_command_and_leaves_the_scripts_own_out() -> None:
    values = env_format.variables(_as_is(["--batch-size", "{batch}"]))
    assert values["AUTOBATCH_COMMAND"] == "python train.py --batch-size 48"
    assert values["AUTOBATCH_MICRO_BATCH_SIZE"] == "48"
    assert not {"AUTOBATCH_PRECISION", "AUTOBATCH_OPTIMIZER", "AUTOBATCH_RECOMPUTE_ACTIVATIONS"} & set(values)


def test_launcher_files_set_the_batch_and_leave_precision_and_optimizer_to_the_script() -> None:
    result = _as_is(["--batch-size", "{batch}"], accumulation=2)
    options = replace(OPTIONS, deepspeed_optimizer=True)
    hf = json.loads(render(result, "hf", options))
    assert hf["per_device_train_batch_size"] == 48 and hf["gradient_accumulation_steps"] == 2
    assert not {"bf16", "fp16", "optim", "gradient_checkpointing", "activation_checkpointing"} & set(hf)
    ds = json.loads(render(result, "deepspeed", options))
    assert ds["train_micro_batch_size_per_gpu"] == 48 and not {"bf16", "fp16", "optimizer"} & set(ds)
    assert "precision" not in yaml.safe_load(render(result, "lightning", options))["trainer"]
    assert "mixed_precision" not in yaml.safe_load(render(result, "accelerate", options))
    for fmt in ("hf", "deepspeed", "lightning", "accelerate", "env"):
        assert any("its own" in note for note in caveats(result, fmt, options)), fmt


def test_an_as_is_result_passes_the_schema() -> None:
    check_result(_as_is(["--batch-size", "{batch}"]).to_dict(), "r.json")


def test_the_written_file_runs_the_job_with_the_tunes_python_and_no_python_on_path(tmp_path: Path) -> None:
    """``sh autobatch-command.sh`` from a job script that did not activate the virtualenv: the line names the Python
    the tune measured with, by its path (it ran ``python`` from PATH: "python: not found", or another Python without
    torch). The script prints the interpreter that runs it."""
    train = tmp_path / "train.py"
    train.write_text("import sys\nprint('batch', sys.argv[2], sys.executable)\n")
    result = _as_is(["--batch-size", "{batch}"], micro=40)
    assert result.as_is is not None
    result.script, result.as_is["python"] = str(train), sys.executable  # as a tune records it
    (path,) = emit(result, [("args", tmp_path / "run.sh")], OPTIONS)
    assert f"# python: {sys.executable}, the interpreter the tune measured with" in " ".join(
        path.read_text().replace("\n#  ", "").split()
    )
    nothing = tmp_path / "empty"
    nothing.mkdir()
    sh = shutil.which("sh")
    assert sh is not None
    done = subprocess.run(
        [sh, str(path)], capture_output=True, text=True, env={"PATH": str(nothing)}, cwd=tmp_path
    )
    assert (done.returncode, done.stdout) == (0, f"batch 40 {sys.executable}\n"), done.stderr


def test_the_line_names_the_recorded_python_and_torchrun_as_its_module() -> None:
    """The tune's interpreter for a world of one and, for a world of several, its ``-m torch.distributed.run``
    (torchrun's module, as ``autobatch run`` starts it); ``autobatch run`` runs the line with its own Python."""
    from autobatch.service.relaunch import job_spec

    result = _as_is(["--batch-size", "{batch}"], micro=16, world=2)
    assert result.as_is is not None
    result.as_is["python"] = "/opt/env/bin/python3"
    assert command(result) == [
        "/opt/env/bin/python3", "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py", "--batch-size", "16"
    ]  # fmt: skip
    assert env_format.variables(result)["AUTOBATCH_COMMAND"].startswith(
        "/opt/env/bin/python3 -m torch.distributed.run"
    )
    assert job_spec(result, (), None).argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    check_result(result.to_dict(), "r.json")
    one = _as_is(["--batch-size", "{batch}"])
    assert one.as_is is not None
    one.as_is["python"] = "/opt/env/bin/python3"
    assert command(one) == ["/opt/env/bin/python3", "train.py", "--batch-size", "48"]


def test_a_result_of_before_the_interpreter_was_recorded_runs_python_and_says_so() -> None:
    text = render(_as_is(["--batch-size", "{batch}"]), "args", OPTIONS)
    assert text.splitlines()[-1] == "python train.py --batch-size 48"
    assert "the first python on PATH (this result does not record the interpreter" in " ".join(
        text.replace("\n#  ", "").split()
    )


def test_a_chosen_variant_adds_its_arguments() -> None:
    result = _as_is(["--batch-size", "{batch}"], micro=96)
    assert result.chosen is not None and result.as_is is not None
    result.chosen = replace(result.chosen, precision="script:bf16")
    result.as_is["variants"] = {"bf16": ["--bf16", "--name", "a b"]}
    assert command(result) == ["python", "train.py", "--batch-size", "96", "--bf16", "--name", "a b"]
    check_result(result.to_dict(), "r.json")  # script:NAME is a precision the schema accepts
