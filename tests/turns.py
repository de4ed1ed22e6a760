"""Turns under pytest-xdist: a test marked ``exclusive`` (it times steps or reads how long our threads waited
for a core) runs its call while no other worker runs a test.

Every test holds a shared lock on one file for its run; an exclusive test takes it exclusively for its call
alone (its fixtures, which may tune for a minute, set up beside other tests), and a turnstile lets a waiting
exclusive test in before new ones. The exclusive tests run last (:func:`pytest_collection_modifyitems`). ``tests/conftest.py`` imports these hooks; ``tests/test_turns.py`` holds
them to it.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: The open lock files of the test that runs (:func:`pytest_runtest_protocol`), for its call's exclusive turn.
_LOCKS = pytest.StashKey[tuple[Any, Any]]()


def _lock_path(config: pytest.Config) -> Path | None:
    """The run's lock file, shared by its xdist workers (None outside xdist: one process runs one test)."""
    worker_input = getattr(config, "workerinput", None)
    if worker_input is None:
        return None
    return Path(worker_input["autobatch_lock_dir"])


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # xdist's controller, once per worker
    folder = getattr(node.config, "_autobatch_lock_dir", None)
    if folder is None:
        folder = tempfile.mkdtemp(prefix="autobatch-xdist-")
        node.config._autobatch_lock_dir = folder
    node.workerinput["autobatch_lock_dir"] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = getattr(config, "_autobatch_lock_dir", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``exclusive`` tests last, in their order: each waits for the test the other worker runs to end (and
    keeps it idle for its call), which in the middle of the run costs that test's remaining minute, and at the
    end overlaps the run's own tail."""
    items.sort(key=lambda item: item.get_closest_marker("exclusive") is not None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    folder = _lock_path(item.config)
    if folder is None:
        yield
        return
    with open(folder / "turnstile", "a+") as turnstile, open(folder / "tests", "a+") as tests:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # behind an exclusive test that waits for its turn
        try:
            fcntl.flock(tests, fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        item.stash[_LOCKS] = (turnstile, tests)
        try:
            yield
        finally:
            fcntl.flock(tests, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """An ``exclusive`` test's call (not its fixtures' setup, which may tune for a minute) runs alone."""
    locks = item.stash.get(_LOCKS, None)
    if locks is None or item.get_closest_marker("exclusive") is None:
        yield
        return
    turnstile, tests = locks
    fcntl.flock(tests, fcntl.LOCK_UN)
    fcntl.flock(turnstile, fcntl.LOCK_EX)  # no new test starts while this one waits for the running ones
    try:
        fcntl.flock(tests, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(tests, fcntl.LOCK_SH)  # back to a shared hold for the teardown
    finally:
        fcntl.flock(turnstile, fcntl.LOCK_UN)
