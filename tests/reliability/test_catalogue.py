"""Every bad input of the catalogue is handled: its documented exit code, a message that names the
problem and the fix, no traceback without --verbose (issue #10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .catalogue import CASES, Case, judge, run_case


def _param(case: Case) -> object:
    marks = [pytest.mark.slow] if case.mode == "server" else []
    return pytest.param(case, id=case.name, marks=marks)


def test_the_catalogue_has_at_least_30_inputs() -> None:
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_a_bad_input_is_handled(case: Case, tmp_path: Path) -> None:
    ran = run_case(case, tmp_path)
    assert judge(case, ran) == [], ran.stderr


def test_verbose_shows_the_scripts_frames_only(tmp_path: Path) -> None:
    from .catalogue import BAD, _in_process

    own = next(c for c in CASES if c.name == "the script's own error")
    argv = ["--verbose", *[a.replace("{bad}", str(BAD)) for a in own.argv]]
    code, _, err = _in_process(own, argv, tmp_path)
    assert code == 3
    assert "Traceback" in err and "own_error.py" in err
    assert "autobatch/step" not in err and "autobatch/probe" not in err
