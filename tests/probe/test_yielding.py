"""A busy CPU restarts the probe server with OpenMP threads that sleep while they wait: real probes beside
real spinning neighbours on every core we may run on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
from support import EXAMPLES, cpu_session, session_settings
from turns import Alone

from autobatch.core.space import Combo
from autobatch.probe.client import ProbeClient
from autobatch.probe.yielding import STALLED_WAIT, YieldingRunner, stalled
from autobatch.records.protocol import ProbeOutcome
from autobatch.run.session import Session
from autobatch.step.spec import ScriptSpec

# every test starts a probe server; two spin neighbours on every core, and no other test may run beside them
# from their session's start (a busy machine would restart the server early) to the busy probe
pytestmark = pytest.mark.slow

COMBO = Combo("32-true", "adamw")
SPIN = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def busy_cores() -> Iterator[None]:
    """As many spinning neighbours as cores we may run on."""
    neighbours = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in os.sched_getaffinity(0)]
    try:
        time.sleep(0.3)  # their interpreters are up and spinning
        yield
    finally:
        for n in neighbours:
            n.kill()
            n.wait(timeout=10)


def _session() -> Session:
    # cpu_session measures no fresh process at the start: its steps would be the first probe a busy machine
    # slows, and the server would restart before the probe these tests watch
    session: Session = cpu_session(EXAMPLES / "mlp.py")
    return session


@pytest.mark.exclusive
def test_a_probe_beside_busy_cores_restarts_the_server_with_passive_threads(
    monkeypatch: pytest.MonkeyPatch, alone: Alone
) -> None:
    # the suite sets one (tests/conftest.py), and a user's own is kept: this test needs none
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with ExitStack() as closing:
        with alone():
            session = closing.enter_context(_session())
            assert isinstance(session.runner, YieldingRunner)
            first_server = session.runner.client.pid
            with busy_cores():
                busy = session.probe(COMBO, 8, min_steps=3, max_steps=3)
        assert busy.fits and busy.cpu_wait is not None and busy.cpu_wait >= STALLED_WAIT, busy.cpu_wait
        assert busy.omp_wait_policy is None  # ran as the user's job would, spinning
        assert (
            session.runner.client.pid == first_server and not session.warnings.messages
        )  # not before it is needed
        after = session.probe(COMBO, 8, min_steps=3, max_steps=3)
        assert after.fits and after.omp_wait_policy == "PASSIVE"
        assert session.runner.client.pid != first_server
        assert not _alive(first_server)
        # memory does not depend on how threads wait
        assert busy.peak_bytes is not None and after.peak_bytes is not None
        assert abs(after.peak_bytes - busy.peak_bytes) < 2 << 20
        (note,) = [w for w in session.warnings.messages if "OMP_WAIT_POLICY=PASSIVE" in w]
        assert "batch 8" in note and "set OMP_WAIT_POLICY yourself" in note
        again = session.probe(COMBO, 9, min_steps=3, max_steps=3)  # once only
        assert again.omp_wait_policy == "PASSIVE" and len(session.warnings.messages) == 1


@pytest.mark.exclusive
def test_the_user_s_own_wait_policy_is_kept(monkeypatch: pytest.MonkeyPatch, alone: Alone) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    with ExitStack() as closing:
        with alone():
            session = closing.enter_context(_session())
            assert isinstance(session.runner, YieldingRunner)
            with busy_cores():
                busy = session.probe(COMBO, 8, min_steps=3, max_steps=3)
        assert busy.cpu_wait is not None and busy.cpu_wait >= STALLED_WAIT
        after = session.probe(COMBO, 8, min_steps=3, max_steps=3)
        assert busy.omp_wait_policy == after.omp_wait_policy == "ACTIVE"
        assert not session.warnings.messages


@pytest.mark.exclusive
def test_the_command_s_own_operations_beside_busy_cores_do_not_restart_the_server(
    monkeypatch: pytest.MonkeyPatch, alone: Alone
) -> None:
    # The session's start (the model's inspection, the job's fresh process and the forked half of its
    # measurement) beside spinning neighbours: the forked half waits for a core as a busy probe does, but it
    # runs as the command's own fresh Python ends, so it decides nothing (it restarted the server in about
    # half of a quiet machine's tunes); the first probe of the search does.
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    settings = session_settings(memory=2 << 30, headroom=0.0, timeout=120, cache=False, fresh_baseline=True)
    with ExitStack() as closing:
        with alone():
            with busy_cores():
                session = closing.enter_context(Session(settings, spec=ScriptSpec.file(EXAMPLES / "mlp.py")))
            assert session.fresh_offsets  # measured beside the busy cores
            assert isinstance(session.runner, YieldingRunner)
            first_server = session.runner.client.pid
            quiet = session.probe(COMBO, 8, min_steps=3, max_steps=3)
            assert quiet.fits and quiet.omp_wait_policy is None
            assert session.runner.client.pid == first_server and not session.warnings.messages
            with busy_cores():
                session.probe(COMBO, 8, min_steps=3, max_steps=3)
        after = session.probe(COMBO, 8, min_steps=3, max_steps=3)
        assert after.omp_wait_policy == "PASSIVE" and session.runner.client.pid != first_server
        (note,) = [w for w in session.warnings.messages if "OMP_WAIT_POLICY=PASSIVE" in w]
        assert "batch 8" in note


def test_a_quiet_probe_or_one_without_a_reading_changes_nothing() -> None:
    with ProbeClient(EXAMPLES / "mlp.py") as client:
        notes: list[str] = []
        runner = YieldingRunner(client, notes.append, environ={})
        pid = client.pid
        assert not stalled(ProbeOutcome("fits", cpu_wait=None))  # CUDA: not measured
        assert not stalled(ProbeOutcome("fits", cpu_wait=STALLED_WAIT / 2))
        assert stalled(ProbeOutcome("fits", cpu_wait=STALLED_WAIT, steps=1))
        # an allocation that failed before the first step: a few milliseconds' share says nothing of the load
        assert not stalled(ProbeOutcome("oom", cpu_wait=2 * STALLED_WAIT, steps=0))
        assert stalled(ProbeOutcome("oom", cpu_wait=2 * STALLED_WAIT, steps=1))
        runner.close()
        assert client.pid == pid and not notes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
