"""Issue 12's pitfalls a new user hit, each as it looked from the command line (fake probe runner)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from support import run_cli, run_main, wire_fake_runner

from autobatch.testing import FakeRunner, affine

MiB = 1 << 20
TUNE = ("tune", "train.py", "--memory", "1GiB", "-p", "32-true", "-o", "adamw", "--no-recompute")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    runner = FakeRunner(affine(400 * MiB, 1.7 * MiB))  # a machine without CUDA, as the fake says
    return wire_fake_runner(runner, tmp_path, monkeypatch)


def test_tune_emit_prints_the_caveats_emit_prints(fake: FakeRunner) -> None:
    code, _, err = run_main(*TUNE, "--device", "cpu", "--emit", "deepspeed", "--emit", "lightning=o.yaml")
    assert code == 0, err
    assert "wrote ds_config.json (deepspeed)" in err and "wrote o.yaml (lightning)" in err
    # a JSON file cannot carry its caveats; tune --emit used to drop them
    assert "note: no optimizer section: build adamw in your code" in err
    assert "note: optimizer adamw is not set here" in err
    assert "micro-batch" in err and "= global" in err


def test_written_files_honour_the_umask(fake: FakeRunner) -> None:
    old = os.umask(0o022)
    try:
        code, _, err = run_main(*TUNE, "--device", "cpu", "--emit", "env")
    finally:
        os.umask(old)
    assert code == 0, err
    for name in ("autobatch-result.json", "autobatch.env"):
        assert stat.S_IMODE(Path(name).stat().st_mode) == 0o644, name  # team-mates can read them


def test_a_fallback_to_the_cpu_is_loud_and_gpu_configs_are_refused(fake: FakeRunner) -> None:
    code, _, err = run_main(*TUNE, "--emit", "deepspeed")
    assert code == 2
    assert "--device auto found no CUDA device" in err or "device auto found no CUDA device" in err
    assert not [r for r in fake.requests if r.op == "probe"], "refused before probing"
    code, _, err = run_main(*TUNE)  # no launcher config asked for: it runs, and says so loudly
    assert code == 0 and "warning: device auto found no CUDA device" in err, err
    saved = json.loads(Path("autobatch-result.json").read_text())
    assert saved["device"]["requested"] == "auto" and saved["notes"][0].startswith("device auto found")
    code, _, err = run_main("emit", "autobatch-result.json", "--format", "accelerate")
    assert code == 2 and "fell back to the CPU" in err and "--allow-cpu" in err
    assert not Path("accelerate_config.yaml").exists()
    code, _, err = run_main("emit", "autobatch-result.json", "--format", "accelerate", "--allow-cpu")
    assert code == 0 and "use_cpu: true" in Path("accelerate_config.yaml").read_text()
    code, _, err = run_main(*TUNE, "--device", "cpu", "--emit", "hf")  # the CPU asked for: no refusal
    assert code == 0 and json.loads(Path("hf_training_args.json").read_text())["use_cpu"] is True


def test_a_bad_result_file_is_refused_naming_the_field(fake: FakeRunner) -> None:
    code, _, _ = run_main(*TUNE, "--device", "cpu")
    data = json.loads(Path("autobatch-result.json").read_text())
    data["chosen"]["micro_batch_size"] = str(data["chosen"]["micro_batch_size"])
    Path("bad.json").write_text(json.dumps(data))
    code, _, err = run_main("emit", "bad.json", "--format", "deepspeed")
    assert code == 2 and "chosen.micro_batch_size: expected an integer, found" in err
    assert not Path("ds_config.json").exists()  # no "train_batch_size": "4848"
    data["chosen"]["micro_batch_size"] = int(data["chosen"]["micro_batch_size"])
    data["schema_version"] = 9
    Path("new.json").write_text(json.dumps(data))
    code, _, err = run_main("emit", "new.json", "--format", "env")
    assert code == 2 and "schema_version: 9 was written by a newer autobatch" in err


@pytest.mark.parametrize("given, meant", [("bf16", "bf16-mixed"), ("16", "16-mixed"), ("32", "32-true")])
def test_lightnings_short_precision_names(fake: FakeRunner, given: str, meant: str) -> None:
    code, out, err = run_main("tune", "train.py", "--device", "cpu", "--memory", "1GiB", "-p", given,
                              "--no-recompute", "--json")  # fmt: skip
    assert code == 0, err
    assert [c["precision"] for c in json.loads(out)["combinations"]] == [meant]


def test_tune_help_shows_every_flag_whole_at_80_columns() -> None:
    proc = run_cli("tune", "--help", env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert proc.returncode == 0
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    for flag in ("--lightning-batch-key", "--deepspeed-optimizer", "--lightning-config", "--global-batch-size",
                 "--exact-all / --no-exact-all", "--allow-cpu", "--hf-task"):  # fmt: skip
        assert flag in proc.stdout, flag
    assert "…" not in proc.stdout


def test_shell_completion_is_on() -> None:
    assert "--install-completion" in run_cli("--help").stdout
    env = {
        "_AUTOBATCH_COMPLETE": "complete_bash",
        "COMP_WORDS": "autobatch tune --lightning-b",
        "COMP_CWORD": "2",
    }
    assert run_cli(env=env).stdout.split() == ["--lightning-batch-key"]
    env.update(COMP_WORDS="autobatch ch", COMP_CWORD="1")
    assert run_cli(env=env).stdout.split() == ["check"]
