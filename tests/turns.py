"""Turns under pytest-xdist: a test marked ``exclusive`` (it times steps or reads how long our threads waited
for a core) runs its call while no other worker runs a test.

Every test holds a shared lock on one file for its run; an exclusive test takes it exclusively for its call
alone (its fixtures, which may tune for a minute, set up beside other tests), or only the parts it puts under
the :func:`alone` fixture; a turnstile lets a waiting exclusive test in before new ones. The slow tests run first, the exclusive ones last
(:func:`pytest_collection_modifyitems`). ``tests/conftest.py`` imports these hooks; ``tests/test_turns.py``
holds them to it.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScheduling

#: The open lock files of the test that runs (:func:`pytest_runtest_protocol`), for its call's exclusive turn.
_LOCKS = pytest.StashKey[tuple[Any, Any]]()


def _lock_path(config: pytest.Config) -> Path | None:
    """The run's lock file, shared by its xdist workers (None outside xdist: one process runs one test)."""
    worker_input = getattr(config, "workerinput", None)
    if worker_input is None:
        return None
    return Path(worker_input["autobatch_lock_dir"])


class OneQueue(LoadScheduling):
    """Workers take the run's tests from the front of one queue, in the order of
    :func:`pytest_collection_modifyitems`: each holds the test it runs and the next one (a worker needs its
    next test to run one), and is given another as one ends. xdist's ``load`` hands out tests in chunks that
    grow while tests are short, so a worker could hold a slow test of the front for minutes while the other
    ran the tail."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self.maxschedchunk = 2  # the first tests: two a worker

    def check_schedule(self, node: Any, duration: float = 0) -> None:
        if node.shutting_down:
            return
        if not self.pending:
            node.shutdown()
            return
        missing = 2 - len(self.node2pending[node])
        if missing > 0:
            self._send_tests(node, missing)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> OneQueue:
    return OneQueue(config, log)


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
    """The ``slow`` tests first, then the others, then the ``exclusive`` ones, each group in its order.

    Workers take tests from the front of one queue (:class:`OneQueue`), so the run ends on short tests, both
    workers busy to the end, instead of one test of a minute beside an idle worker. An exclusive test waits for
    the test the other worker runs to end (and keeps it idle for its call): in the middle of the run that costs
    that test's remaining minute, at the end it overlaps the run's own tail."""
    items.sort(
        key=lambda item: (
            item.get_closest_marker("exclusive") is not None,
            item.get_closest_marker("slow") is None,
        )
    )


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
    """An ``exclusive`` test's call (not its fixtures' setup, which may tune for a minute) runs alone; one that
    asks for :func:`alone` runs alone only what it puts under it."""
    if item.get_closest_marker("exclusive") is None or "alone" in getattr(item, "fixturenames", ()):
        yield
        return
    with _turn(item.stash.get(_LOCKS, None)):
        yield


#: What the :func:`alone` fixture gives: ``with alone():``.
Alone = Callable[[], AbstractContextManager[None]]


@pytest.fixture
def alone(request: pytest.FixtureRequest) -> Alone:
    """For a test marked ``exclusive`` whose call times only a part of what it does: ``with alone():`` runs that
    part while no other worker runs a test, and the rest (a tune's checks, a server's start) beside them."""
    return lambda: _turn(request.node.stash.get(_LOCKS, None))


@contextmanager
def _turn(locks: tuple[Any, Any] | None) -> Iterator[None]:
    """The exclusive turn: no new test starts while this one waits for the running ones to end."""
    if locks is None:  # outside xdist
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
            fcntl.flock(tests, fcntl.LOCK_SH)  # back to a shared hold for the rest of the test
    finally:
        fcntl.flock(turnstile, fcntl.LOCK_UN)
