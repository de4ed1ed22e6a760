"""The suite's turns under pytest-xdist (``tests/turns.py``): an ``exclusive`` test's call runs alone, its
fixtures' setup beside the other worker's tests. A run of its own: two workers, a test marked ``exclusive``
whose fixture takes a while, and short tests beside it, each writing when it ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a pytest run of its own, with two workers

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from turns import alone, pytest_configure_node, pytest_runtest_call, pytest_runtest_protocol, pytest_unconfigure

def pytest_configure(config):
    config.addinivalue_line("markers", "exclusive: runs alone")
"""

RECORD = """
import json, os, time
import pytest

def record(what, start):
    with open(os.environ["TURNS_LOG"], "a") as log:
        log.write(json.dumps([what, start, time.monotonic()]) + "\\n")
"""

EXCLUSIVE = (
    RECORD
    + """
@pytest.fixture
def tuned():
    start = time.monotonic()
    time.sleep(2.0)
    record("setup", start)

@pytest.mark.exclusive
def test_alone(tuned):
    start = time.monotonic()
    time.sleep(1.0)
    record("exclusive", start)

@pytest.mark.exclusive
def test_a_part_alone(alone):
    start = time.monotonic()
    time.sleep(1.0)
    record("beside", start)
    with alone():
        start = time.monotonic()
        time.sleep(1.0)
        record("part", start)
"""
)

SHARED = (
    RECORD
    + """
@pytest.mark.parametrize("n", range(16))
def test_beside(n):
    start = time.monotonic()
    time.sleep(0.4)
    record("shared", start)
"""
)


def test_an_exclusive_call_runs_alone_and_its_fixtures_set_up_beside_other_tests(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_a_exclusive.py").write_text(EXCLUSIVE)
    (tmp_path / "test_b_shared.py").write_text(SHARED)
    log = tmp_path / "turns.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "worksteal"],
        cwd=tmp_path,
        env={**_env(), "TURNS_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    (setup,) = [(a, b) for what, a, b in runs if what == "setup"]
    (alone,) = [(a, b) for what, a, b in runs if what == "exclusive"]
    (beside,) = [(a, b) for what, a, b in runs if what == "beside"]
    (part,) = [(a, b) for what, a, b in runs if what == "part"]
    shared = [(a, b) for what, a, b in runs if what == "shared"]
    assert len(shared) == 16
    assert not [s for s in shared if _overlap(s, alone)], (alone, shared)  # the call ran alone
    assert [s for s in shared if _overlap(s, setup)], (setup, shared)  # its setup kept no other test waiting
    # a test that asks for `alone` runs alone only what it puts under it
    assert not [s for s in shared if _overlap(s, part)], (part, shared)
    assert [s for s in shared if _overlap(s, beside)], (beside, shared)


def _overlap(one: tuple[float, float], other: tuple[float, float]) -> bool:
    return one[0] < other[1] and other[0] < one[1]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AUTOBATCH_"))}


def test_the_slow_tests_run_first_and_the_exclusive_ones_last_in_their_order(tmp_path: Path) -> None:
    conftest = CONFTEST.replace("from turns import ", "from turns import pytest_collection_modifyitems, ")
    conftest += '\n    config.addinivalue_line("markers", "slow: takes a while")\n'
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_a_exclusive.py").write_text(
        EXCLUSIVE
        + EXCLUSIVE.replace("test_alone", "test_alone_too").replace("test_a_part_alone", "test_part_too")
    )
    (tmp_path / "test_b_shared.py").write_text(SHARED)
    (tmp_path / "test_c_slow.py").write_text(
        "import pytest\n\n@pytest.mark.slow\ndef test_long():\n    pass\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    order = [line.partition("::")[2] for line in proc.stdout.splitlines() if "::" in line]
    assert order == [
        "test_long",
        *(f"test_beside[{n}]" for n in range(16)),
        "test_alone",
        "test_a_part_alone",
        "test_alone_too",
        "test_part_too",
    ], order
