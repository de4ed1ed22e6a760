"""`estimate` exits 6, not 0, when no combination could be simulated (issue #10)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import run_main


def _every_scenario_fails(
    settings: Any, options: Any, timeout: float, lengths: tuple[int | None, ...]
) -> tuple[dict[int | None, dict[str, Any]], str]:
    scenarios = [
        {"name": s.name, "scenario": s.scenario.to_dict(), "status": "error",
         "error": "aten.nonzero: data-dependent output shape"}
        for s in options.scenarios
    ]  # fmt: skip
    return {seq_len: {"scenarios": scenarios, "baseline_bytes": 300 << 20} for seq_len in lengths}, "fake"


def test_estimate_of_nothing_exits_6(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autobatch.explain.parent.estimator._run", _every_scenario_fails)
    script = tmp_path / "train.py"
    script.write_text("# never imported here\n")
    code, _, err = run_main(
        "estimate", str(script), "--device", "cpu", "--memory", "2GiB", "-p", "32-true", "-o", "sgd"
    )
    assert code == 6, err
    assert "no combination could be simulated" in err and "data-dependent" in err
    assert "autobatch tune" in err  # the fix
