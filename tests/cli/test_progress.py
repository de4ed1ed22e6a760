"""The live line's parts: the probe's step reports, the display's text, the runner that feeds it."""

from __future__ import annotations

from pathlib import Path

import pytest
from requesting import probe_request

from autobatch.cli.progress import LiveProbe, Output, WatchedRunner
from autobatch.core.space import Combo
from autobatch.probe.progress import OPTION, read_step, reporting
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.step.loop import StepReport
from autobatch.testing import FakeRunner, affine


def request(**options: object) -> ProbeRequest:
    return probe_request(96, "bf16-mixed", "adamw", level="full", options=dict(options))


def test_the_probe_reports_each_finished_step_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "step"
    report = StepReport()
    peaks = iter([10, 20, 30])
    unwatched = reporting(lambda: next(peaks), request(), report)
    assert unwatched() == 10 and not path.exists()
    watched = reporting(lambda: next(peaks), request(**{OPTION: str(path)}), report)
    assert watched() == 20 and read_step(str(path)) == 1
    report.step_peaks.append(20)
    assert watched() == 30 and read_step(str(path)) == 2
    assert read_step(str(tmp_path / "missing")) is None


def test_the_live_line_names_the_combination_batch_step_and_time() -> None:
    display = LiveProbe()
    try:
        assert display.text() == ""
        with display._lock:
            display.request, display.started = request(), 0.0
        text = display.text()
        assert text.startswith(
            "probing bf16-mixed/adamw/recompute batch 96: step 1 of 3-8, "
        ) and text.endswith(" s")
        Path(display.path).write_text("2")
        assert "step 3 of 3-8" in display.text()
    finally:
        display.stop()


def test_the_live_line_of_a_script_run_as_it_is_says_what_its_probe_waits_for() -> None:
    from dataclasses import replace

    display = LiveProbe()
    try:
        with display._lock:
            display.request, display.started = replace(request(), op="as_is"), 0.0
        assert "batch 96: step 1 of 3-8" in display.text()
        Path(display.path).write_text("11 waiting for the first step of Adam (optimizer 2 of 2 built)")
        assert (
            "batch 96: step 12, waiting for the first step of Adam (optimizer 2 of 2 built), "
            in display.text()
        )
    finally:
        display.stop()


def test_the_watched_runner_asks_probes_for_their_steps_and_passes_answers_through() -> None:
    inner = FakeRunner(affine(100, 1))
    display = LiveProbe()
    display.begin = lambda r: setattr(display, "request", r)  # type: ignore[method-assign]  # no terminal here
    runner = WatchedRunner(inner, display)
    try:
        outcome = runner.run(request())
        assert outcome.fits and inner.requests[-1].options[OPTION] == display.path
        runner.run(probe_request(0, "32-true", "sgd", budget_bytes=0, min_steps=0, max_steps=0, op="inspect"))
        assert OPTION not in inner.requests[-1].options and display.request is None
        runner.close()
        assert inner.closed and runner.torch_version == "fake"
    finally:
        display.stop()


@pytest.mark.parametrize("wrote", [True, False], ids=["a-step-reported", "none-reported"])
def test_the_live_line_leaves_no_folder_behind(wrote: bool) -> None:
    display = LiveProbe()
    if wrote:
        Path(display.path).write_text("2")
    display.stop()
    assert not Path(display.folder).exists()


def test_quiet_keeps_only_the_summary(capfd: pytest.CaptureFixture[str]) -> None:
    out = Output(quiet=True)
    out.status("device cpu")
    out.warning("something")
    out.probe(Combo("32-true", "adamw"), ProbeOutcome("fits", 8, peak_bytes=1 << 20), False)
    out.summary("autobatch: the answer")
    (line,) = capfd.readouterr().err.splitlines()  # a log: with its timestamp
    assert line.endswith(" autobatch: the answer")
    assert out.watch(FakeRunner(affine(1, 1))).__class__ is FakeRunner


def test_log_lines_carry_a_timestamp(capfd: pytest.CaptureFixture[str]) -> None:
    Output(quiet=False, live=False).status("device cpu")
    line = capfd.readouterr().err
    assert line[:4].isdigit() and line[4] == "-" and line[10] == " " and line.rstrip().endswith(" device cpu")
