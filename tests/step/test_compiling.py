"""``torch.compile`` in the step: one compiled graph for every batch size, compile time kept apart from step
time, the inductor cache on disk shared, a compiler's failure told apart from the script's.

Compiling costs seconds on a small CPU (a tiny MLP: 15-40 s with a cold cache, 2-5 s warm, on two
busy cores), so these tests compile one tiny MLP, in a cache folder shared by the test runs.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

from autobatch.core.step_peaks import StepRule
from autobatch.probe.compile_errors import COMPILE_ERROR, note_compile_failure
from autobatch.probe.oom import classify_exception
from autobatch.records.protocol import ProbeOutcome
from autobatch.step.compiling import INDUCTOR_CACHE_ENV, CompileClock, inductor_cache_dir, use_inductor_cache
from autobatch.step.contract import UserScript
from autobatch.step.loop import StepConfig, StepReport, build_step, draw_batch, one_step, run_steps


def _mlp(width: int = 64) -> UserScript:
    return UserScript(
        Path("<mlp>"),
        ModuleType("mlp"),
        lambda: torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.GELU(), torch.nn.Linear(width, 4)),
        lambda batch_size: (torch.randn(batch_size, 32), torch.randn(batch_size, 4)),
        lambda model, batch: torch.nn.functional.mse_loss(model(batch[0]), batch[1]),
    )


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh Dynamo in this process, and the test runs' own inductor cache folder (warm after a first run)."""
    import torch._dynamo

    folder = os.path.join(tempfile.gettempdir(), f"autobatch-inductor-tests-{os.getuid()}")
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, folder)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    torch._dynamo.reset()
    yield folder
    torch._dynamo.reset()


def _run(script: UserScript, config: StepConfig, steps: int = 3) -> StepReport:
    return run_steps(
        script,
        config,
        StepReport(),
        StepRule(steps, steps, 0),
        peak_now=lambda: 0,
        synchronize=lambda: None,
        batch_per_step=True,
    )


def test_the_cache_folder_is_autobatchs_unless_the_user_named_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    assert inductor_cache_dir() == os.path.join(tempfile.gettempdir(), f"autobatch-inductor-{os.getuid()}")
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "tune"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what importing torch._dynamo sets
    assert use_inductor_cache() == str(tmp_path / "tune") == os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert (tmp_path / "tune").is_dir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert use_inductor_cache() == str(tmp_path / "mine")
    import torch._inductor.config

    assert torch._inductor.config.fx_graph_cache is True


@pytest.mark.slow
def test_one_compile_serves_two_batch_sizes_and_its_time_is_kept_apart(cache: str) -> None:
    script = _mlp()
    started = time.perf_counter()
    report = _run(script, StepConfig(8, "32-true", "adamw", compile=True))
    wall = time.perf_counter() - started
    assert report.steps == 3
    assert report.compile_seconds is not None and report.compile_seconds > 0.2
    # step times leave the compiling out: together they add up to no more than the wall time
    assert report.compile_seconds + sum(report.step_seconds) <= wall
    assert report.step_seconds[0] < report.compile_seconds
    assert max(report.step_seconds[1:]) < report.compile_seconds / 10
    assert os.listdir(cache)  # inductor wrote its cache there

    # The same compiled graph at another batch size: the batch dimension was traced dynamic.
    config = StepConfig(8, "32-true", "adamw", compile=True)
    with CompileClock() as clock:
        step = build_step(script, config, StepReport())
        one_step(step)
        compiled = clock.compiles
        for batch_size in (24, 5):
            step.batch = draw_batch(script, StepConfig(batch_size, "32-true", "adamw"), compiling=True)
            one_step(step)
    assert clock.available
    assert clock.compiles == compiled, "another batch size recompiled"
    assert step.model(torch.randn(24, 32)).shape == (24, 4)


def test_without_compile_there_is_no_compile_time() -> None:
    report = _run(_mlp(), StepConfig(8, "32-true", "sgd"), steps=2)
    assert report.compile_seconds is None


@pytest.mark.slow
def test_a_compiler_failure_is_a_compile_error_not_the_scripts(
    cache: str, monkeypatch, tmp_path: Path
) -> None:
    import torch._inductor.config

    # No working C++ compiler (what a machine without g++ gives on the CPU device), and a cold cache so that
    # nothing compiled before can be loaded instead.
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(torch._inductor.config.cpp, "cxx", (None, "/bin/false"))
    with pytest.raises(Exception) as raised:
        _run(_mlp(width=48), StepConfig(8, "32-true", "sgd", compile=True), steps=1)
    exc = raised.value
    assert classify_exception(exc) == "error"
    outcome = ProbeOutcome(kind="error")
    assert note_compile_failure(outcome, exc)
    assert outcome.error_type == COMPILE_ERROR and outcome.info["compile_error"] is True
    assert "C++ compiler" in (outcome.error_message or "") and "\n" not in (outcome.error_message or "")
