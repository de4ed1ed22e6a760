"""The probe server and its isolated probe processes, for real: fits, oom, error, timeout, crash."""

from __future__ import annotations

import os
import time

import psutil
import pytest
from requesting import probe_request
from support import EXAMPLES, SCRIPTS, cpu_session

from autobatch.core.space import Combo
from autobatch.errors import ScriptError
from autobatch.probe.client import ProbeClient
from autobatch.records.protocol import ProbeRequest
from autobatch.records.readings import observation

pytestmark = pytest.mark.slow  # every test starts a probe server

GIB = 1 << 30


def _request(batch: int, budget: int, **kw: object) -> ProbeRequest:
    values = dict(
        batch_size=batch,
        precision="32-true",
        optimizer="adamw",
        device="cpu",
        budget_bytes=budget,
        min_steps=3,
        max_steps=8,
        timeout=300.0,
    )
    values.update(kw)
    return probe_request(**values)  # type: ignore[arg-type]


def _descendants() -> list[psutil.Process]:
    return psutil.Process(os.getpid()).children(recursive=True)


def test_fits_and_oom_are_data_and_peak_is_what_the_cap_limits() -> None:
    with ProbeClient(EXAMPLES / "mlp.py") as client:
        small = client.run(_request(8, 2 * GIB))
        assert small.kind == "fits", small
        assert small.steps >= 3
        assert small.peak_bytes is not None and small.baseline_bytes is not None
        assert small.baseline_bytes < small.peak_bytes <= 2 * GIB
        assert small.step_peaks == sorted(small.step_peaks)  # cumulative peaks
        # AdamW: exp_avg + exp_avg_sq, plus one scalar step counter per parameter tensor
        assert 0 <= small.optimizer_state_bytes - 2 * small.param_bytes <= 1024
        # What the throughput choice reads: how long its threads waited for a core, over its wall time, and
        # the static memory the search's guess scales over.
        assert small.cpu_wait is not None and 0 <= small.cpu_wait < 2
        static = small.baseline_bytes + small.param_bytes + small.grad_bytes + small.optimizer_state_bytes
        assert observation(small).static_bytes == static < small.peak_bytes
        huge = client.run(_request(1_000_000, 2 * GIB))
        assert huge.kind == "oom", huge
        assert huge.error_message and "allocate" in huge.error_message


def test_script_error_is_an_error_not_an_oom() -> None:
    with ProbeClient(SCRIPTS / "value_error.py") as client:
        ok = client.run(_request(8, 2 * GIB))
        assert ok.kind == "fits"
        bad = client.run(_request(65, 2 * GIB))
        assert bad.kind == "error"
        assert bad.error_type == "ValueError" and "exceeds" in (bad.error_message or "")
        assert bad.traceback and "make_batch" in bad.traceback


def test_timeout_kills_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLEEPY_SECONDS", "60")
    with ProbeClient(SCRIPTS / "sleepy.py") as client:
        started = time.monotonic()
        outcome = client.run(_request(1, 2 * GIB, timeout=2.0))
        assert outcome.kind == "timeout"
        assert time.monotonic() - started < 20
        server = psutil.Process(client.pid)
        assert server.children() == []  # the killed probe is gone


def test_crash_is_reported_as_crash() -> None:
    with ProbeClient(SCRIPTS / "crash.py") as client:
        assert client.run(_request(2, 2 * GIB)).kind == "fits"
        outcome = client.run(_request(8, 2 * GIB))
        assert outcome.kind == "crash"
        assert "signal" in (outcome.reason or "")


def test_close_leaves_no_process() -> None:
    client = ProbeClient(EXAMPLES / "mlp.py")
    assert _descendants()
    client.close()
    deadline = time.monotonic() + 5
    while _descendants() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _descendants() == []


def test_session_raises_script_errors_with_message() -> None:
    with cpu_session(SCRIPTS / "value_error.py") as session:
        with pytest.raises(ScriptError, match="exceeds"):
            session.probe(Combo("32-true", "adamw"), 100, min_steps=3, max_steps=3)


def test_a_fit_within_the_margin_of_the_budget_is_not_counted() -> None:
    """The search does not stand on a batch whose peak lands within the CPU margin of the cap."""
    from autobatch.devices.budget import DeviceInfo, apply_margin

    with ProbeClient(EXAMPLES / "mlp.py") as client:
        outcome = client.run(_request(8, 2 * GIB))
    assert outcome.fits and outcome.peak_bytes

    def device(budget: int) -> DeviceInfo:
        return DeviceInfo("cpu", "cpu", budget, budget, 0.0, "VmData")

    roomy = device(outcome.peak_bytes + 4 * (1 << 20))
    assert roomy.margin_bytes == 3 << 20
    assert not apply_margin(outcome, roomy) and outcome.fits
    tight = device(outcome.peak_bytes + 100 * 1024)
    assert apply_margin(outcome, tight)
    assert outcome.kind == "oom" and "less than the 3.00 MiB margin" in (outcome.reason or "")
    # a large budget gets a proportional margin; CUDA's verdict has none
    assert device(16 * GIB).margin_bytes == 16 * GIB // 1000
    assert DeviceInfo("cuda", "cuda:0", GIB, GIB, 0.0, "allocated").margin_bytes == 0
    # the line a search's probe stops at: the budget less the margin, none without a margin
    assert roomy.margin_line == roomy.budget_bytes - (3 << 20)
    assert DeviceInfo("cuda", "cuda:0", GIB, GIB, 0.0, "allocated").margin_line is None


def test_a_search_probe_stops_at_the_step_whose_peak_crosses_its_line() -> None:
    """A peak above the search's line (budget less the margin) cannot come back under it, so a
    confirmation-length probe that crosses it at its first step ends there, as an out-of-memory answer
    that says why; the same request without a line runs every step and fits the cap."""
    with ProbeClient(EXAMPLES / "mlp.py") as client:
        full = client.run(_request(8, 2 * GIB, min_steps=6, max_steps=6))
        assert full.kind == "fits" and full.steps == 6, full
        line = full.step_peaks[0] - (16 << 20)  # well under step 1's peak in any fresh process
        stopped = client.run(_request(8, 2 * GIB, min_steps=6, max_steps=6, stop_above_bytes=line))
    assert stopped.kind == "oom" and stopped.steps == 1, stopped
    assert stopped.stopped_above_bytes == line and (stopped.peak_bytes or 0) > line
    assert "at step 1 of at most 6 and stopped" in (stopped.reason or "")
    assert stopped.samples_per_second is None
