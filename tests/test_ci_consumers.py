"""CI runs the consumer tests for real: under AUTOBATCH_REQUIRE_CONSUMERS=1 a consumer test that would skip
fails (tests/conftest.py), and setup.sh --dev and .ci/run say so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

SKIPPING = """
import pytest

pytestmark = pytest.mark.consumers


def test_needs_a_missing_library():
    pytest.importorskip("lightning_not_installed_here")
"""


def run_pytest(folder: Path, required: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AUTOBATCH_REQUIRE_CONSUMERS"}
    if required:
        env["AUTOBATCH_REQUIRE_CONSUMERS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "consumers", str(folder)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_a_skipping_consumer_test_fails_when_consumers_are_required(tmp_path: Path) -> None:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    shutil.copy(TESTS / "turns.py", tmp_path / "turns.py")  # the hooks the conftest imports
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    consumers: loads emitted files\n")
    (tmp_path / "test_needs.py").write_text(SKIPPING)
    relaxed = run_pytest(tmp_path, required=False)
    assert relaxed.returncode == 0 and "1 skipped" in relaxed.stdout
    assert "consumer tests: 0 ran, 1 skipped" in relaxed.stdout
    strict = run_pytest(tmp_path, required=True)
    assert strict.returncode == 1 and "1 failed" in strict.stdout, strict.stdout
    assert "a consumer test must run" in strict.stdout


def test_ci_requires_the_consumers_and_setup_checks_them() -> None:
    assert "export AUTOBATCH_REQUIRE_CONSUMERS=1" in (ROOT / ".ci" / "run").read_text()
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    for name in "transformers lightning accelerate deepspeed jsonargparse dotenv datasets".split():
        assert f'"{name}"' in setup, name
    assert "note: deepspeed did not install" not in setup  # it used to carry on, and its tests skipped
