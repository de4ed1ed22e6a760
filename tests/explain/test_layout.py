"""explain's layout: the operations' options cross the process boundary intact, the modules the parent
names register the operations, and only worker/ imports torch."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

from support import ROOT

from autobatch.explain.pure.maxima import Offset
from autobatch.explain.pure.options import (
    ESTIMATE,
    EXPLAIN,
    OP_MODULES,
    Calibration,
    EstimateOptions,
    ExplainOptions,
    NamedScenario,
)
from autobatch.explain.pure.records import Scenario, Transforms
from autobatch.probe import ops


def test_options_round_trip_through_their_dicts() -> None:
    explain = ExplainOptions(instrument=False, transforms=Transforms(inplace=True, vocab_trim=0.25))
    assert ExplainOptions.from_dict(explain.to_dict()) == explain
    assert ExplainOptions.from_dict({}) == ExplainOptions()
    now = Scenario("32-true", "adamw", False)
    estimate = EstimateOptions(
        budget_bytes=1 << 30,
        max_batch_size=4096,
        batch_multiple=8,
        scenarios=(
            NamedScenario("now", now),
            NamedScenario("bf16", Scenario("bf16-mixed", "adamw", False), ((8, 99),)),
        ),
        target="cuda",
        optimizer_kwargs={"adamw": {"lr": 0.1}},
        calibrate=Calibration(now, ((8, 100), (4, 60))),
        offset=Offset(5.0, 1.0, "given"),
        report_at=(8,),
    )
    assert EstimateOptions.from_dict(estimate.to_dict()) == estimate


def test_only_the_worker_side_imports_torch() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import autobatch.explain as explain\n"
        "for sub in ('pure', 'parent', 'output'):\n"
        "    package = importlib.import_module(f'autobatch.explain.{sub}')\n"
        "    for info in pkgutil.iter_modules(package.__path__):\n"
        "        importlib.import_module(f'autobatch.explain.{sub}.{info.name}')\n"
        "print('torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_modules_the_parent_names_register_the_operations() -> None:
    for name in OP_MODULES:
        importlib.import_module(name)
    assert {EXPLAIN, ESTIMATE} <= set(ops.operations())
