"""``autobatch.tune()`` and ``autobatch.check()`` with a fake probe runner: what they take, what they return,
where their output goes. The probes themselves are the real server's in test_api_notebook.py."""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path

import pytest
from support import run_main

import autobatch
from autobatch.api import _spec
from autobatch.cli.state import STATE
from autobatch.core.units import format_bytes
from autobatch.devices.budget import margin_bytes
from autobatch.errors import NothingFitsError, UsageError
from autobatch.records.schema import result_problems
from autobatch.settings import FIELDS, load_settings
from autobatch.step.contract import load_spec
from autobatch.testing import FakeRunner, affine, true_max

GiB, MiB = 1 << 30, 1 << 20
CURVE = affine(400 * MiB, 1.7 * MiB)
ONE = {
    "device": "cpu",
    "memory": "1GiB",
    "precisions": ["32-true"],
    "optimizers": ["adamw"],
    "recompute": False,
}


def build_model() -> str:
    return "model"


def make_batch(batch_size: int) -> list[int]:
    return [batch_size]


def compute_loss(model: str, batch: list[int]) -> int:
    return batch[0]


STEP = {"build_model": build_model, "make_batch": make_batch, "compute_loss": compute_loss}


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for info in FIELDS:
        if info.env not in ("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR"):  # the test's own (conftest)
            monkeypatch.delenv(info.env, raising=False)


def test_tune_takes_the_callables_and_returns_the_json_result(capsys: pytest.CaptureFixture[str]) -> None:
    events: list[autobatch.ProbeEvent] = []
    result = autobatch.tune(**STEP, **ONE, runner=FakeRunner(CURVE), on_probe=events.append)
    budget = int(GiB * 0.9)
    assert result.combinations[0].max_batch_size == true_max(
        CURVE, budget - margin_bytes("cpu", budget), 65536
    )
    assert result.chosen is not None and result.status == "complete"
    assert result.script == f"<callables from {__name__}>"
    assert result_problems(result.to_dict()) == []  # what --json prints, valid against the schema
    assert len(events) == result.combinations[0].probes and str(events[0]).startswith("32-true/adamw/")
    assert capsys.readouterr().out == ""  # never stdout
    assert not Path("autobatch-result.json").exists()  # no file unless result= is given


def test_a_result_shows_itself_in_a_line_and_keeps_every_field() -> None:
    """What a notebook shows of ``result`` (its repr) is its answer in a line: status, the chosen plan, the
    device and its budget, what the probes cost, how many notes (it was the whole dataclass: every combination's
    trace of probes, pages of it). The fields are all there as before."""
    result = autobatch.tune(**STEP, **ONE, global_batch_size=512, runner=FakeRunner(CURVE))
    chosen, (entry,) = result.chosen, result.combinations
    assert chosen is not None and entry.trace and result.notes  # what the line leaves out is still there
    plan = f"micro-batch {chosen.micro_batch_size} x accumulation {chosen.accumulation_steps} x world 1 = global 512"
    assert repr(result) == (
        f"<TuneResult complete: 32-true/adamw/no-recompute {plan}; cpu, budget 921.60 MiB; "
        f"{result.probes} probes over 1 combination, {result.wall_seconds:.1f} s; {len(result.notes)} notes>"
    )
    assert repr(entry) == (
        f"<ComboResult 32-true/adamw/no-recompute: exact, max batch {entry.max_batch_size}, peak "
        f"{format_bytes(entry.peak_bytes or 0)}, {entry.probes} probes>"
    )
    assert "\n" not in repr(result) and "trace" not in repr(result.combinations)


def test_progress_goes_to_logging_without_a_callback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="autobatch"):
        autobatch.tune(**STEP, **ONE, runner=FakeRunner(CURVE), result="out/r.json")
    lines = [r.getMessage() for r in caplog.records if r.name == "autobatch"]
    assert any("batch 8: fits" in line for line in lines) and any(
        line.startswith("chosen:") for line in lines
    )
    assert json.loads(Path("out/r.json").read_text())["status"] == "complete"


def test_settings_are_keyword_arguments_named_as_in_the_toml(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'memroy'; did you mean 'memory'"):
        autobatch.tune(**STEP, memroy="1GiB")
    Path("autobatch.toml").write_text("[device]\nheadroom = 0.5\n")
    runner = FakeRunner(CURVE)
    result = autobatch.tune(**STEP, **ONE, runner=runner)
    assert result.device["headroom"] == 0.1  # a stray ./autobatch.toml is not read
    assert autobatch.tune(**STEP, **ONE, runner=runner, config="autobatch.toml").device["headroom"] == 0.5
    monkeypatch.setenv("AUTOBATCH_HEADROOM", "0.3")  # the environment is, as for the CLI
    assert autobatch.tune(**STEP, **ONE, runner=runner).device["headroom"] == 0.3
    assert autobatch.tune(**STEP, **ONE, runner=runner, headroom=0.2).device["headroom"] == 0.2


def test_nothing_fits_carries_the_result() -> None:
    with pytest.raises(NothingFitsError) as info:
        autobatch.tune(**STEP, **ONE, runner=FakeRunner(affine(2 * GiB, MiB)))
    result = info.value.result  # type: ignore[attr-defined]
    assert (
        result.status == "complete"
        and result.chosen is None
        and result.combinations[0].status == "infeasible"
    )


def test_check_returns_what_check_json_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = FakeRunner(CURVE)
    report = autobatch.check(
        **STEP, batch_size=64, precision="bf16", device="cpu", memory="1GiB", runner=runner
    )
    assert report.fits and report.steps == 10 and report.precision == "bf16-mixed"
    big = autobatch.check(**STEP, batch_size=600, device="cpu", memory="1GiB", runner=runner)
    assert not big.fits and big.kind == "oom"  # an answer, not an error
    Path("train.py").write_text("# the fake runner never imports it\n")
    monkeypatch.setattr(STATE, "runner_factory", lambda: FakeRunner(CURVE))
    code, out, _ = run_main(
        "check", "train.py", "-b", "64", "-p", "bf16", "--device", "cpu", "--memory", "1GiB", "--json"
    )
    assert code == 0 and json.loads(out).keys() == report.to_dict().keys()


def test_a_check_shows_itself_in_a_line_as_the_command_prints_it() -> None:
    """A notebook cell ending in ``autobatch.check(...)`` shows the answer in a line, as ``TuneResult`` and
    ``ComboResult`` do (it showed the whole dataclass: every step's peak and time, the device's stats, the reason's
    traceback); the fields are all there."""
    runner = FakeRunner(CURVE)
    fits = autobatch.check(
        **STEP, batch_size=64, precision="bf16", device="cpu", memory="1GiB", runner=runner
    )
    seconds = sum(fits.step_seconds) / len(fits.step_seconds)
    assert repr(fits) == (
        f"<CheckResult bf16-mixed/adamw/no-recompute batch 64 on {fits.device}: fits after 10 steps, peak "
        f"{format_bytes(fits.peak_bytes or 0)} of budget {format_bytes(fits.budget_bytes)}, {seconds:.3f} s/step>"
    )
    big = autobatch.check(**STEP, batch_size=600, device="cpu", memory="1GiB", runner=runner)
    assert repr(big).startswith("<CheckResult 32-true/adamw/no-recompute batch 600 on ") and (
        ": out of memory after " in repr(big)
    )
    assert "\n" not in repr(big) and len(repr(big)) < 300 and big.step_peaks is not None


def test_check_keywords_shape_its_probe_and_the_rest_are_settings() -> None:
    # precision, optimizer, recompute, compile and steps are check()'s own (steps and recompute also name
    # settings of a tune's search: here they shape the one probe); every other keyword is a setting.
    runner = FakeRunner(CURVE)
    report = autobatch.check(
        **STEP, batch_size=64, precision="bf16", optimizer="sgd", recompute="selective", compile=True, steps=7,
        device="cpu", memory="1GiB", confirm_steps=9, runner=runner,
    )  # fmt: skip
    assert (report.precision, report.optimizer, report.recompute_level, report.compile) == (
        "bf16-mixed",
        "sgd",
        "selective",
        True,
    )
    assert report.steps == 7 and report.recompute
    assert (
        autobatch.check(
            **STEP, batch_size=64, device="cpu", memory="1GiB", confirm_steps=9, runner=runner
        ).steps
        == 9
    )
    with pytest.raises(TypeError, match="did you mean 'precisions'"):
        autobatch.check(**STEP, batch_size=64, precisionz="bf16", runner=runner)


def test_the_step_may_be_a_path_a_reference_a_module_or_an_object(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("# the fake runner never imports it\n")
    runner = FakeRunner(CURVE)
    assert autobatch.tune("train.py", **ONE, runner=runner).script == str(tmp_path / "train.py")
    assert autobatch.tune(tmp_path / "train.py", **ONE, runner=runner).script == str(tmp_path / "train.py")
    assert autobatch.tune(sys.modules[__name__], **ONE, runner=runner).script == __name__
    assert (
        autobatch.tune(types.SimpleNamespace(**STEP), **ONE, runner=runner).script
        == "<SimpleNamespace from types>"
    )
    with pytest.raises(TypeError, match="not a training step"):
        autobatch.tune(42, **ONE, runner=runner)
    with pytest.raises(TypeError, match="not both"):
        autobatch.tune("train.py", build_model=build_model, make_batch=make_batch)


def test_notebook_functions_travel_by_value() -> None:
    """What ``__main__`` holds in a notebook: functions cloudpickle cannot import by name."""
    main = types.ModuleType("__main__")
    exec(  # noqa: S102 - defines the step as a notebook cell does
        "WIDTH = 5\n"
        "def build_model():\n    return 'net'\n"
        "def make_batch(batch_size):\n    return [WIDTH] * batch_size\n"
        "def compute_loss(model, batch):\n    return sum(batch)\n",
        main.__dict__,
    )
    with _spec(main, load_settings(use_default_file=False, env={}), (None, None, None)) as spec:
        assert spec.kind == "pickled" and spec.label == "<__main__>"
        script = load_spec(spec)
    assert script.compute_loss(script.build_model(), script.make_batch(3)) == 15


def test_a_cpu_fallback_is_loud_and_refuses_gpu_launcher_configs(caplog: pytest.LogCaptureFixture) -> None:
    runner = FakeRunner(CURVE)  # it reports no CUDA device
    auto = {**ONE, "device": "auto"}
    with caplog.at_level(logging.WARNING, logger="autobatch"):
        result = autobatch.tune(**STEP, **auto, runner=runner)
    assert result.device["requested"] == "auto" and result.device["type"] == "cpu"
    assert result.notes[0].startswith("device auto found no CUDA device")
    assert any("found no CUDA device" in r.getMessage() for r in caplog.records)
    runner.requests.clear()
    with pytest.raises(UsageError, match=r"launcher configs \(deepspeed\)"):
        autobatch.tune(**STEP, **auto, emit=["deepspeed"], runner=runner)
    assert all(r.op == "inspect" for r in runner.requests)  # refused before any probe
    autobatch.tune(**STEP, **auto, emit=["hf"], allow_cpu=True, runner=runner)
    assert json.loads(Path("hf_training_args.json").read_text())["use_cpu"] is True


def test_the_api_runs_in_its_callers_process_whatever_the_daemon_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/daemon.md#the-python-api: callables, on_probe and typed errors cannot cross a command's argv."""
    folder = tmp_path / "daemon"
    monkeypatch.setenv("AUTOBATCH_DAEMON_DIR", str(folder))
    monkeypatch.setenv("AUTOBATCH_DAEMON", "on")  # on: a command that cannot reach a daemon is an error
    events: list[autobatch.ProbeEvent] = []
    result = autobatch.tune(**STEP, **ONE, runner=FakeRunner(CURVE), on_probe=events.append)
    assert result.status == "complete" and events
    checked = autobatch.check(**STEP, **ONE, batch_size=4, runner=FakeRunner(CURVE), daemon="on")
    assert checked.fits
    assert not folder.exists()  # no daemon was looked for, let alone started
