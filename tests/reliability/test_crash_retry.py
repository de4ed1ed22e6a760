"""A crash or timeout is not an out-of-memory (issue #10): retried once, then it limits the answer, loudly.

Before the fix: a fitting probe killed once lowered the maximum, and a script that crashed above a batch
gave that batch as an "exact" maximum, exit 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_main

from autobatch.cli.state import STATE
from autobatch.devices.budget import margin_bytes
from autobatch.errors import EXIT_PROBE_FAILURE
from autobatch.records.protocol import ProbeRequest
from autobatch.settings import FIELDS
from autobatch.testing import affine, true_max

from .faulty import FaultyRunner

GiB, MiB = 1 << 30, 1 << 20
BUDGET = int(GiB * 0.9)
CURVE = affine(400 * MiB, 1.7 * MiB)
TRUE_MAX = true_max(CURVE, BUDGET - margin_bytes("cpu", BUDGET), 65536)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for info in FIELDS:
        if info.env != "AUTOBATCH_LOCK_DIR":  # the test's own lock folder (conftest): never another run's
            monkeypatch.delenv(info.env, raising=False)
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "train.py").write_text("# the fake runner never imports it\n")
    return tmp_path


def tune(runner: FaultyRunner, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, object], str]:
    monkeypatch.setattr(STATE, "runner_factory", lambda: runner)
    code, out, err = run_main(
        "tune", "train.py", "--device", "cpu", "--memory", "1GiB", "-p", "32-true", "-o", "adamw",
        "--no-recompute", "--json",
    )  # fmt: skip
    saved = Path("autobatch-result.json")
    return code, json.loads(saved.read_text()) if saved.exists() else {}, err


def test_a_probe_killed_once_is_retried_and_the_maximum_is_right(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def once(request: ProbeRequest, attempt: int) -> str | None:
        return "crash" if attempt == 1 and request.batch_size > 8 else None

    code, result, err = tune(FaultyRunner(CURVE, fault=once), monkeypatch)
    combo = result["combinations"][0]  # type: ignore[index]
    assert code == 0, err
    assert (combo["status"], combo["max_batch_size"]) == ("exact", TRUE_MAX)


@pytest.mark.parametrize("kind", ["crash", "timeout"])
def test_a_persistent_crash_limits_the_maximum_and_says_so(
    kind: str, env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = FaultyRunner(CURVE, fault=lambda request, attempt: kind if request.batch_size > 32 else None)
    code, result, err = tune(runner, monkeypatch)
    combo = result["combinations"][0]  # type: ignore[index]
    assert code == EXIT_PROBE_FAILURE, err
    assert combo["status"] == f"{kind}-limited"
    assert combo["max_batch_size"] == 32
    assert f"limited by a {kind} at batch 33, not by memory" in combo["reason"]
    assert f"limited by a {kind} at batch 33" in err  # the summary says it too
    assert result["chosen"] is None  # a limited maximum is never chosen
    # every crash ran twice (the retry), and the journal spares a re-run both
    crashed = [r for r in runner.requests if r.op == "probe" and r.batch_size > 32]
    assert crashed and len(crashed) == 2 * len({(r.batch_size, r.min_steps) for r in crashed})
    again = FaultyRunner(CURVE, fault=lambda request, attempt: kind if request.batch_size > 32 else None)
    code2, result2, _ = tune(again, monkeypatch)
    assert code2 == EXIT_PROBE_FAILURE
    assert [r for r in again.requests if r.op == "probe"] == []
    assert result2["combinations"][0]["status"] == f"{kind}-limited"  # type: ignore[index]


def test_a_longer_timeout_is_not_served_a_journaled_timeout(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def hang(request: ProbeRequest, attempt: int) -> str | None:
        return "timeout" if request.batch_size > 32 and request.timeout < 100 else None

    monkeypatch.setenv("AUTOBATCH_TIMEOUT", "50")
    code, _, _ = tune(FaultyRunner(CURVE, fault=hang), monkeypatch)
    assert code == EXIT_PROBE_FAILURE
    monkeypatch.setenv("AUTOBATCH_TIMEOUT", "500")
    code, result, err = tune(FaultyRunner(CURVE, fault=hang), monkeypatch)
    assert code == 0, err
    assert result["combinations"][0]["max_batch_size"] == TRUE_MAX  # type: ignore[index]
