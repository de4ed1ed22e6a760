"""Golden files: every format over every plan case, byte for byte.

The cases (``emit_cases.py``) cover each precision, with and without accumulation, at world sizes 1
and 4, plus an inexact plan, a CPU tune, a plan without a requested global batch and the remaining
optimizer mappings. The options are fixed (dates included), so the output is deterministic.

To regenerate after an intended change::

    AUTOBATCH_UPDATE_GOLDEN=1 pytest tests/emit/test_emit_golden.py

then review ``git diff tests/emit/golden``; a missing golden file fails the test unless that
variable is set.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from emit_cases import BY_NAME, CASE_IDS, DATA, GOLDEN, OPTIONS, UPDATE_GOLDEN, WHOLE_CASES

from autobatch.emit import FORMATS, render

LAUNCHERS = ["deepspeed", "hf", "lightning", "accelerate", "env"]


def check_golden(path: Path, text: str) -> None:
    if os.environ.get(UPDATE_GOLDEN):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"no golden file {path}; run with {UPDATE_GOLDEN}=1 to create it"
    assert text == path.read_text(encoding="utf-8"), (
        f"{path} differs; if intended, regenerate with {UPDATE_GOLDEN}=1"
    )


@pytest.mark.parametrize("fmt", LAUNCHERS)
@pytest.mark.parametrize("case", CASE_IDS)
def test_launcher_golden(case: str, fmt: str) -> None:
    text = render(BY_NAME[case].result(), fmt, OPTIONS)
    check_golden(GOLDEN / case / FORMATS[fmt].filename, text)


@pytest.mark.parametrize("fmt", ["json", "toml"])
@pytest.mark.parametrize("case", WHOLE_CASES)
def test_whole_result_golden(case: str, fmt: str) -> None:
    text = render(BY_NAME[case].result(), fmt, OPTIONS)
    check_golden(GOLDEN / case / FORMATS[fmt].filename, text)


@pytest.mark.parametrize("case", ["bf16-mixed_accum_w4", "32-true_noaccum_w1", "16-mixed_accum_w4"])
def test_deepspeed_base_golden(case: str) -> None:
    options = replace(OPTIONS, deepspeed_base=str(DATA / "ds_base_zero2.json"))
    text = render(BY_NAME[case].result(), "deepspeed", options)
    check_golden(GOLDEN / case / "ds_config_on_base.json", text)


def test_hf_golden_for_older_transformers() -> None:
    options = replace(OPTIONS, transformers_version="4.57.1")
    text = render(BY_NAME["bf16-mixed_accum_w4"].result(), "hf", options)
    check_golden(GOLDEN / "bf16-mixed_accum_w4" / "hf_training_args_transformers4.json", text)


def test_no_golden_file_is_stale() -> None:
    """Every file under golden/ is produced by some test above (a renamed case leaves none behind)."""
    if os.environ.get(UPDATE_GOLDEN):
        pytest.skip("regenerating")
    expected = {GOLDEN / c / FORMATS[f].filename for c in CASE_IDS for f in LAUNCHERS}
    expected |= {GOLDEN / c / FORMATS[f].filename for c in WHOLE_CASES for f in ("json", "toml")}
    expected |= {
        GOLDEN / c / "ds_config_on_base.json"
        for c in ("bf16-mixed_accum_w4", "32-true_noaccum_w1", "16-mixed_accum_w4")
    }
    expected.add(GOLDEN / "bf16-mixed_accum_w4" / "hf_training_args_transformers4.json")
    present = {p for p in GOLDEN.rglob("*") if p.is_file()}
    assert present == expected
