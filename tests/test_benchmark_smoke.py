"""Smoke test of scripts/benchmark.py: one small workload, a small cap, autobatch and accelerate only.

It proves the harness runs end to end (calibrated cap, autobatch tune, a comparator in a capped
worker process, the fresh-process bisection of the true maximum, the holds? checks, the saved
Markdown) in well under a minute; the real benchmark's numbers come from running the script itself.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import ROOT

if importlib.util.find_spec("accelerate") is None:  # found, not imported: collection stays quick
    pytest.skip("accelerate is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow  # the harness starts probe servers

BENCHMARK = ROOT / "scripts" / "benchmark.py"


def test_benchmark_smoke(tmp_path: Path) -> None:
    output = tmp_path / "benchmark.md"
    args = [
        "--workloads", "quadratic", "--cap", "quadratic=363MiB", "--methods", "autobatch,accelerate",
        "--no-equal-room", "--no-overhead", "--no-fresh-check", "--timeout", "240", "--output", str(output),
    ]  # fmt: skip
    busy = os.getloadavg()[0] > len(os.sched_getaffinity(0))  # other work on the machine slows every probe
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert busy or elapsed < 60, f"the smoke run took {elapsed:.0f} s on an idle machine"

    text = output.read_text()
    assert f"`python scripts/benchmark.py {' '.join(args[:-1])}" in text  # the exact command line
    assert re.search(r"torch \d+\.\d+", text) and "nproc" in text
    truth = re.search(r"True maximum .*?\*\*(\d+)\*\*", text)
    assert truth, text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"autobatch", "accelerate"}, rows
    assert "lightning-binsearch" not in rows  # only the methods asked for ran
    for method in ("autobatch", "accelerate"):
        cells = [c.strip() for c in rows[method].split("|")[1:-1]]
        found, wall = cells[1], cells[5]
        assert found.isdigit() and int(found) >= 1, rows[method]
        assert float(wall) > 0
        assert cells[3] in ("yes", "**no**"), rows[method]  # holds? was checked in a fresh process
    assert "## Summary against issue 14's targets" in text
    assert "autobatch's answer equals the true maximum" in text
