"""The plan a tune answers holds in the job it plans, for as long as the job runs: `autobatch run` tunes a plain
loop on the CPU device and then runs it for epochs under the same cap.

A red-team's case: `examples/as_is/plain_loop.py` tuned at 600 MiB (maximum about 120, plan 64 x 1), then run. The
probes ran glibc's allocator pinned (every block of 64 KiB or more a mapping of its own), the job glibc's defaults,
whose heap keeps what each step freed and grows over the epochs: 626-665 MiB at 64 over two epochs against
442 MiB pinned. The job ran out under its cap. Every CPU plan now carries the allocator the probes ran.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from support import ROOT, run_cli

pytestmark = pytest.mark.slow


def test_a_plain_loop_runs_its_epochs_at_the_tuned_plan_under_the_same_cap(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "examples" / "as_is" / "plain_loop.py", work / "plain_loop.py")
    proc = run_cli(
        "run", "plain_loop.py", "--device", "cpu", "--memory", "600MiB", "--global-batch-size", "64",
        "--max-restarts", "0", "--", "--batch-size", "{batch}", "--epochs", "3",
        cwd=work, env={"AUTOBATCH_CACHE_DIR": str(tmp_path / "cache")}, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]  # exit 5: the job ran out of memory at the plan
    assert proc.stdout.splitlines()[-1].startswith("epoch 2 step 0")  # every epoch ran
    launch = re.search(
        r"launch 1: peak ([\d.]+) MiB \(tuned [\d.]+ MiB, budget ([\d.]+) MiB\) at micro-batch (\d+)",
        proc.stderr,
    )
    assert launch is not None, proc.stderr[-4000:]
    peak, budget, micro = float(launch[1]), float(launch[2]), int(launch[3])
    assert micro == 64 and peak <= budget, proc.stderr[-4000:]  # within the budget, not only the 600 MiB cap
