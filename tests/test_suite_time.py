"""scripts/suite_time.py: its pure parts (pytest's summary line read from the log, the table's verdicts)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import suite_time as st  # noqa: E402


def _round(setup: float, pytest: float, status: int = 0) -> st.Round:
    failed = ["tests/test_a.py::test_b"] if status else []
    return st.Round(setup, pytest, status, "1718 passed, 2 skipped", 0.03, 0.2, 0.5, failed)


def test_pytest_summary_lines_are_read_in_their_quiet_and_their_framed_forms() -> None:
    log = "....\n1718 passed, 2 skipped, 34 warnings in 770.10s (0:12:50)\n"
    assert st.SUMMARY.findall(log)[-1][0] == "1718 passed, 2 skipped, 34 warnings"
    framed = "===== 3 failed, 10 passed in 5.01s =====\n"
    assert st.SUMMARY.findall(framed)[-1][0] == "3 failed, 10 passed"


def test_the_goal_counts_the_setup_and_a_failing_run_never_meets_it() -> None:
    rows = st.table([_round(37, 850), _round(37, 870), _round(30, 800, status=1)], goal=900)
    assert "| 1 | 37 | 850 | 887 | met |" in rows[2]
    assert (
        "| 2 | 37 | 870 | 907 | **missed** |" in rows[3]
    )  # pytest alone is under 900 s; with the setup, not
    assert "| 3 | 30 | 800 | 830 | **missed** |" in rows[4]
    assert rows[5] == "- round 3 failed: `tests/test_a.py::test_b`"  # which tests, kept with the table


def test_the_failing_tests_are_read_from_pytests_short_summary() -> None:
    log = "=== short test summary info ===\nFAILED tests/x.py::test_y - AssertionError: no\nFAILED tests/z.py::t[a]\n"
    assert st.FAILED.findall(log) == ["tests/x.py::test_y", "tests/z.py::t[a]"]
