"""A job script's ``AUTOBATCH_*`` variables, through the real command on the CPU device.

Every ``AUTOBATCH_*`` name that is no setting's variable is ignored: the env file's plan, sourced by the job
(``AUTOBATCH_MICRO_BATCH_SIZE``, ``AUTOBATCH_PRECISION``), must not change the next tune. A mistyped or shortened
setting (``AUTOBATCH_GLOBAL_BATCH=64`` for ``AUTOBATCH_GLOBAL_BATCH_SIZE``) or a flag's name (``AUTOBATCH_OUTPUT``
for ``--output``, whose variable is ``AUTOBATCH_RESULT``) was ignored as silently, and the job trained with a plan
for another global batch; it gets a warning naming the variable meant, and the env file's names none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import EXAMPLES, run_cli

pytestmark = pytest.mark.slow

#: What a job that sourced an earlier calibration's env file has in its environment.
SOURCED = {
    "AUTOBATCH_MICRO_BATCH_SIZE": "16",
    "AUTOBATCH_ACCUMULATION_STEPS": "2",
    "AUTOBATCH_PLAN_WORLD_SIZE": "1",
    "AUTOBATCH_PLAN_GLOBAL_BATCH_SIZE": "32",
    "AUTOBATCH_PRECISION": "32-true",
    "AUTOBATCH_OPTIMIZER": "sgd",
    "AUTOBATCH_RECOMPUTE_LEVEL": "off",
}


def test_a_mistyped_setting_variable_is_warned_about_and_the_env_files_names_are_not(tmp_path: Path) -> None:
    proc = run_cli(
        "tune", str(EXAMPLES / "mlp.py"), "--device", "cpu", "--memory", "420MiB", "-p", "32-true", "-o", "sgd",
        "--no-recompute", "--max-batch-size", "8", "--no-cache", "--output", str(tmp_path / "r.json"), "--json",
        cwd=tmp_path, env={**SOURCED, "AUTOBATCH_GLOBAL_BATCH": "64", "AUTOBATCH_OUTPUT": str(tmp_path / "other.json")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "warning: AUTOBATCH_" in line]
    assert len(warned) == 2, proc.stderr
    assert "AUTOBATCH_GLOBAL_BATCH is no setting's variable and is ignored" in warned[0]
    assert "did you mean AUTOBATCH_GLOBAL_BATCH_SIZE?" in warned[0]
    assert "AUTOBATCH_OUTPUT" in warned[1] and "did you mean AUTOBATCH_RESULT?" in warned[1]
    assert not any(name in proc.stderr for name in SOURCED)
    chosen = json.loads(proc.stdout)["chosen"]
    assert chosen["requested_global_batch_size"] is None  # ignored, as said: no global batch was asked for
    assert not (tmp_path / "other.json").exists()
