"""Shared fixtures: every test gets its own probe cache and its own folder of device locks, and no
fresh-process measurement unless it asks for one, and the probes' OpenMP threads sleep while they wait (the
two workers keep the cores busy). Under
``AUTOBATCH_REQUIRE_CONSUMERS=1`` (CI sets it in ``.ci/run``) a consumer library that is missing fails
the run instead of skipping its tests.

Two guards keep the suite's split and its parallel run honest:

* a test not marked ``slow`` that starts a probe server fails (``AUTOBATCH_NO_PROBE_SERVER``, read by
  :class:`autobatch.probe.client.ProbeClient`), so ``pytest -m "not slow"`` stays the quick loop;
* under pytest-xdist, a test marked ``exclusive`` (it times steps or reads how long our threads waited for
  a core) runs its call while no other worker runs a test (``tests/turns.py``, whose hooks this module
  imports).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from turns import (  # noqa: F401  # the hooks and the fixture, found by pytest in this module
    alone,
    pytest_collection_modifyitems,
    pytest_configure_node,
    pytest_runtest_call,
    pytest_runtest_protocol,
    pytest_unconfigure,
    pytest_xdist_make_scheduler,
)

# Messages name temporary paths (longer under xdist's per-worker folders): wide enough that no phrase a test
# looks for is wrapped. Set before autobatch.cli's console reads it, at its import.
os.environ["COLUMNS"] = "400"
# Two workers keep both cores busy, so every probe runs beside load: torch's OpenMP threads would spin while
# they wait for a core, and each command's server would restart with passive threads after its first stalled
# probe (autobatch.probe.yielding), paying a second start. Told up front, as a user on a shared machine would
# (a setting of the user's own is kept): the suite ran in 878-925 s against 1204 s (docs/development.md). Memory
# does not depend on how threads wait; tests of the switch itself remove it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Helpers shared by the tests (support.py) are imported by name from every folder under tests/.
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Set by .ci/run: the consumer libraries are part of the test environment, so none may be skipped.
REQUIRE = "AUTOBATCH_REQUIRE_CONSUMERS"
#: Import names of the libraries that load emitted files, host the integrations or read the data `autobatch
#: lengths` takes (the consumers extra).
CONSUMERS = ("transformers", "lightning", "accelerate", "deepspeed", "jsonargparse", "dotenv", "hjson", "datasets")  # fmt: skip
_counts = {"ran": 0, "skipped": 0}


def _required() -> bool:
    return os.environ.get(REQUIRE, "") not in ("", "0")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _required():
        missing = [name for name in CONSUMERS if importlib.util.find_spec(name) is None]
        if missing:
            pytest.exit(
                f"{REQUIRE}=1 but these consumer libraries cannot be imported: {', '.join(missing)}", 3
            )


def _names_a_consumer(report: Any) -> bool:
    return any(name in str(report.longrepr) for name in CONSUMERS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    consumer = item.get_closest_marker("consumers") is not None
    if report.skipped and (consumer or _names_a_consumer(report)) and _required():
        report.outcome = "failed"
        report.longrepr = f"skipped under {REQUIRE}=1 (a consumer test must run): {report.longrepr}"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Counted where the reports arrive: in the one process, or in xdist's controller (a worker's counts
    would never reach the summary)."""
    consumer = "consumers" in report.keywords
    if report.when == "call" and consumer and report.passed:
        _counts["ran"] += 1
    elif report.skipped and (consumer or _names_a_consumer(report)):
        _counts["skipped"] += 1
    elif report.failed and "a consumer test must run" in str(report.longrepr):
        _counts["skipped"] += 1


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped and _names_a_consumer(report):
        _counts["skipped"] += 1
        if _required():
            report.outcome = "failed"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _counts["ran"] or _counts["skipped"]:
        terminalreporter.write_line(
            f"consumer tests: {_counts['ran']} ran, {_counts['skipped']} skipped"
            + (f" ({REQUIRE}=1: skips fail)" if _required() else "")
        )


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees another's probes, or waits for another's device lock."""
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("AUTOBATCH_LOCK_DIR", str(tmp_path_factory.mktemp("locks")))
    # The fresh-process measurement (CPU) costs a run about ten seconds and moves maxima by a few MiB: the
    # tests that are about it turn it back on (tests/probe/test_fresh.py, tests/cli/test_fresh_process_e2e.py,
    # the catalogue's case); the rest compare like with like without it.
    monkeypatch.setenv("AUTOBATCH_FRESH_BASELINE", "false")


@pytest.fixture(autouse=True)
def _fast_tests_start_no_probe_server(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if request.node.get_closest_marker("slow") is None:
        monkeypatch.setenv(
            "AUTOBATCH_NO_PROBE_SERVER",
            f"{request.node.nodeid} is not marked slow: mark it @pytest.mark.slow",
        )
