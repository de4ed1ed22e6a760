"""How long a process's threads waited for a core, as the throughput choice reads it: a busy neighbour on
our cores shows, our own work does not."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from autobatch.core.choice import quiet
from autobatch.devices import cpu

BUSY = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end:\n    pass\n"


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _waited(seconds: float) -> float | None:
    """This thread spinning: its run-queue time over the wall time of the window (a thread that ends
    takes its figure with it, so the one that spins is the one that reads)."""
    start = cpu.read_run_wait()
    _spin(seconds)
    return cpu.waiting_share(start, cpu.read_run_wait())


@pytest.mark.exclusive  # how long our threads wait for a core: no other test may run beside it
def test_one_thread_of_our_own_does_not_wait() -> None:
    """Quiet in one of three windows: work outside the suite (another user's job on the machine) comes in
    bursts and can load one window, where a neighbour on our cores loads every one (the test below)."""
    readings = [_waited(0.5) for _ in range(3)]
    assert all(w is not None for w in readings)
    assert any(quiet(w) for w in readings if w is not None), readings


@pytest.mark.slow
@pytest.mark.exclusive  # its neighbours must be the only ones on our cores
def test_a_neighbour_on_our_cores_makes_our_threads_wait() -> None:
    """One spinning neighbour more than the cores we may run on, beside one thread of ours: it waits for a
    core about half the time (with as many neighbours as cores, a third in theory, and 0.19 was seen at the
    end of a full run, where the scheduler let ours run alone longer)."""
    cores = len(os.sched_getaffinity(0))
    neighbours = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(cores + 1)]
    try:
        time.sleep(0.3)  # the neighbours' interpreters are up and spinning
        waited = _waited(1.0)
    finally:
        for n in neighbours:
            n.wait(timeout=10)
    assert waited is not None and waited > 0.2 and not quiet(waited)


def test_no_readings_no_figure() -> None:
    now = cpu.read_run_wait()
    assert now is not None and now.waited >= 0
    assert cpu.waiting_share(None, now) is None and cpu.waiting_share(now, None) is None
    assert cpu.waiting_share(now, now) is None  # no time passed


def test_the_share_of_time_waited_stops_at_all_of_it() -> None:
    """Run-queue times add up over the threads: two waiting at once for 0.8 s of a second read 1.6, which a
    warning showed as "waited for a core 160% of its time". A share stops at 1."""
    assert cpu.waiting_share(cpu.RunWait(0.0, 10.0), cpu.RunWait(1.6, 11.0)) == 1.0
    assert cpu.waiting_share(cpu.RunWait(0.0, 10.0), cpu.RunWait(0.4, 11.0)) == pytest.approx(0.4)
