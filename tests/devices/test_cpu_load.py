"""Other processes' CPU work, as the throughput choice reads it: a busy neighbour shows, our own work does not."""

from __future__ import annotations

import subprocess
import sys
import time

from autobatch.core.choice import quiet
from autobatch.devices import cpu

BUSY = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end:\n    pass\n"


def _window(seconds: float, work: bool) -> float | None:
    start = cpu.read_cpu_times()
    end_at = time.monotonic() + seconds
    while work and time.monotonic() < end_at:
        sum(range(1000))  # our own work: not another process's
    if not work:
        time.sleep(seconds)
    return cpu.other_cores(start, cpu.read_cpu_times())


def _background() -> float:
    """What the rest of the machine does anyway (daemons; anything else running beside the tests)."""
    idle = _window(0.5, work=False)
    assert idle is not None
    return idle


def test_our_own_work_is_not_load() -> None:
    background = _background()
    others = _window(0.8, work=True)
    assert others is not None and others < background + 0.3


def test_a_neighbour_that_keeps_a_core_busy_reads_about_one_core() -> None:
    background = _background()
    neighbour = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.3)  # the neighbour's interpreter is up and spinning
        others = _window(0.8, work=False)
    finally:
        neighbour.wait(timeout=10)
    assert others is not None and 0.7 < others - background < 1.3
    assert not quiet(others)


def test_no_readings_no_figure() -> None:
    now = cpu.read_cpu_times()
    assert now is not None and now.machine_busy > 0
    assert cpu.other_cores(None, now) is None and cpu.other_cores(now, None) is None
    assert cpu.other_cores(now, now) is None  # no time passed
