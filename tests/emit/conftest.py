"""Fixtures for the emitter tests: a realistic tune result and the fixed emit options."""

from __future__ import annotations

import pytest
from emit_cases import OPTIONS, realistic_result

from autobatch.emit import EmitOptions
from autobatch.records.result import TuneResult


@pytest.fixture
def tune_result() -> TuneResult:
    """A realistic result (a small GPT on an A100) whose chosen plan is 12 x 5 x 4 = 240 in bf16-mixed."""
    from emit_cases import BY_NAME

    return BY_NAME["bf16-mixed_accum_w4"].result()


@pytest.fixture
def nothing_fits() -> TuneResult:
    """A result where no combination fits, so nothing is chosen."""
    result = realistic_result()
    for combo in result.combinations:
        combo.status, combo.max_batch_size = "infeasible", None
    return result


@pytest.fixture
def options() -> EmitOptions:
    return OPTIONS
