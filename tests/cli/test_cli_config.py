"""``autobatch init`` and ``autobatch validate``: through Typer's CliRunner, through ``main()`` (which
maps errors to exit codes) and through the real command in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import run_main
from typer.testing import CliRunner

from autobatch.cli.root import app  # every command registered
from autobatch.errors import EXIT_USAGE, ConfigError, UsageError
from autobatch.settings import FIELDS, Settings, load_settings, render_starter_toml

ROOT = Path(__file__).resolve().parents[2]

THREE_MISTAKES = """\
[device]
headrom = 0.2

[search]
precisions = ["fp8"]

[probe]
steps = 1
"""
THREE_PROBLEMS = [
    'bad.toml: device.headrom: unknown key; did you mean "headroom"?',
    'bad.toml: search.precisions: expected precision names from 32-true, bf16-mixed, 16-mixed, bf16-true, found "fp8"',
    "bad.toml: probe.steps: expected an integer >= 3, found 1",
]


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in an empty folder, with no AUTOBATCH_* setting from the caller's environment."""
    monkeypatch.chdir(tmp_path)
    for info in FIELDS:
        if info.env != "AUTOBATCH_LOCK_DIR":  # the test's own lock folder (conftest): never another run's
            monkeypatch.delenv(info.env, raising=False)


def run_command(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real command in a fresh interpreter."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOBATCH_")}
    full_env.update({"NO_COLOR": "1", "COLUMNS": "250", "PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "autobatch", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- init ----------------------------------------------------------------------------------------------


def test_init_writes_the_starter_file_that_loads_to_defaults(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["init"])
    assert result.exit_code == 0, result.output
    written = tmp_path / "autobatch.toml"
    assert written.read_text() == render_starter_toml()
    loaded = load_settings(env={}, cwd=tmp_path)
    assert loaded == Settings(source_files=(str(written),))
    assert not list(tmp_path.glob(".autobatch.toml.*")), "no temporary file left behind"


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    target = tmp_path / "conf" / "job.toml"
    target.parent.mkdir()
    target.write_text("[probe]\nsteps = 5\n")
    result = CliRunner().invoke(app, ["init", str(target)])
    assert isinstance(result.exception, UsageError) and "already exists" in result.exception.message
    code, _, err = run_main("init", str(target))
    assert code == EXIT_USAGE
    assert f"error: {target} already exists" in err and "hint: pass --force" in err
    assert target.read_text() == "[probe]\nsteps = 5\n", "the file is untouched"
    code, _, err = run_main("init", str(target), "--force")
    assert code == 0 and f"wrote {target}" in err
    assert target.read_text() == render_starter_toml()


def test_a_usage_errors_message_and_hint_are_printed_apart_each_once(tmp_path: Path) -> None:
    """The error's text carries its hint (a traceback in the user's own process shows it); the command prints the
    message and the hint on lines of their own, each once, as it did before."""
    (tmp_path / "autobatch.toml").write_text("")
    done = run_command("init", cwd=tmp_path)
    assert done.returncode == EXIT_USAGE
    assert done.stderr == (
        "error: autobatch.toml already exists\nhint: pass --force to overwrite it, or give another PATH\n"
    )


def test_init_into_a_new_folder_and_not_onto_a_folder(tmp_path: Path) -> None:
    assert run_main("init", "new/sub/autobatch.toml")[0] == 0
    assert (tmp_path / "new" / "sub" / "autobatch.toml").is_file()
    code, _, err = run_main("init", "new")
    assert code == EXIT_USAGE and "is a folder" in err


# --- validate ------------------------------------------------------------------------------------------


def test_validate_ok_prints_a_summary_to_stderr(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "autobatch.toml").write_text(
        '[script]\nscript = "train.py"\nscript_args = ["--size", "small"]\n[device]\ndevice = "cpu"\nmemory = "2GiB"\n'
        '[plan]\nglobal_batch_size = 256\n[output]\nemit = ["deepspeed", "env=job.env"]\n'
    )
    code, out, err = run_main("validate")
    assert code == 0 and out == ""
    assert err.startswith("ok: autobatch.toml")
    for piece in ["script train.py --size small", "device cpu, memory 2.00 GiB, headroom 0.1",
                  "= 8 combination(s)", "global batch 256", "emit deepspeed, env=job.env"]:  # fmt: skip
        assert piece in err, piece


def test_validate_says_the_lengths_and_the_compile_a_tune_searches(tmp_path: Path) -> None:
    """Lengths and compile multiply what a tune searches: the summary said 8 combinations for 16, and nothing of
    the lengths or the plan's length."""
    (tmp_path / "autobatch.toml").write_text(
        '[search]\nseq_lens = [512, 2048]\ncompile = "both"\n[plan]\nseq_len = 1024\n'
    )
    code, _, err = run_main("validate")
    assert code == 0, err
    assert "x 4 recompute x 2 compile = 16 combination(s); lengths 512, 2048;" in err, err
    assert "global batch not set, at 1024 tokens," in err, err


def test_validate_json_prints_the_effective_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.toml").write_text("[probe]\nsteps = 4\n")
    monkeypatch.setenv("AUTOBATCH_HEADROOM", "0.3")
    code, out, err = run_main("validate", "a.toml", "--json")
    assert code == 0 and "from the environment: AUTOBATCH_HEADROOM" in err
    data = json.loads(out)
    assert data["probe"]["steps"] == 4 and data["device"]["headroom"] == 0.3
    assert json.loads(run_main("validate", "a.toml", "--json", "--no-env")[1])["device"]["headroom"] == 0.1


def test_validate_reports_three_mistakes_at_once_through_cli_runner(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(THREE_MISTAKES)
    result = CliRunner().invoke(app, ["validate", "bad.toml"])
    assert isinstance(result.exception, ConfigError)
    assert result.exception.exit_code == EXIT_USAGE
    assert sorted(result.exception.problems) == sorted(THREE_PROBLEMS)
    code, out, err = run_main("validate", "bad.toml")
    assert code == EXIT_USAGE and out == ""
    assert "error: 3 problems in the settings" in err
    for problem in THREE_PROBLEMS:
        assert problem in err


def test_validate_reports_three_mistakes_at_once_as_a_real_command(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(THREE_MISTAKES)
    done = run_command("validate", "bad.toml", cwd=tmp_path)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stdout == ""
    assert "error: 3 problems in the settings" in done.stderr
    for problem in THREE_PROBLEMS:
        assert problem in done.stderr
    assert "hint:" in done.stderr


def test_validate_checks_the_script_exists_and_names_environment_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "autobatch.toml").write_text('[script]\nscript = "missing.py"\n')
    monkeypatch.setenv("AUTOBATCH_OBJECTIVE", "fastest")
    code, _, err = run_main("validate")
    assert code == EXIT_USAGE and "2 problems" in err
    assert 'autobatch.toml: script.script: expected an existing file, found "missing.py"' in err
    assert 'AUTOBATCH_OBJECTIVE: expected one of throughput, max-batch, found "fastest"' in err


def test_validate_without_a_file(tmp_path: Path) -> None:
    code, _, err = run_main("validate")
    assert code == EXIT_USAGE and "autobatch.toml: no such config file" in err and "autobatch init" in err


def test_validate_and_init_do_not_import_torch(tmp_path: Path) -> None:
    (tmp_path / "autobatch.toml").write_text("[probe]\nsteps = 4\n")
    code = (
        "import sys\n"
        "from autobatch.cli import main\n"
        "for argv in (['init', 'x.toml'], ['validate']):\n"
        "    sys.argv = ['autobatch', *argv]\n"
        "    main()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print('clean')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "clean", done.stderr
