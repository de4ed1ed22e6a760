"""Threads that yield on a busy CPU: the probe server restarts with OpenMP's passive wait policy once a
probe shows that another process keeps the cores busy.

torch's OpenMP threads spin while they wait for each other, and beside a busy core the step stalls. After
the first probe whose threads waited for a core at least :data:`STALLED_WAIT` of its wall time (CPU only),
the server restarts with :data:`YIELDING_ENV`, once; a user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``
is kept. Why, and what it changes: docs/how-a-tune-works.md ("Spinning threads") and
docs/measurements/busy-threads.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Protocol

from autobatch.records.protocol import ProbeOutcome, ProbeRequest, ProbeRunner
from autobatch.records.result import Circumstance

#: What the restarted server's probes inherit: OpenMP threads that sleep while they wait.
YIELDING_ENV: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
#: A probe whose threads waited this share of its wall time for a core ran beside load (the throughput
#: choice calls a probe quiet under 0.1) (docs/measurements/in-the-code.md).
STALLED_WAIT = 0.25
#: Settings of the user's own that decide how OpenMP threads wait: present, the probes keep them.
USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


class Reopening(ProbeRunner, Protocol):
    """A probe server that starts again with more environment (:class:`autobatch.probe.client.ProbeClient`,
    which starts this runner and so is not imported here)."""

    def reopen(self, env: dict[str, str]) -> None: ...


class YieldingRunner:
    """The probe server's runner, restarted once with :data:`YIELDING_ENV` after a probe that stalled, before
    the next operation (a command whose last probe stalled does not pay for a restart it would not use).

    ``on_switch`` receives the note that says which probe it was and what changed."""

    def __init__(
        self,
        client: Reopening,
        on_switch: Callable[[str], None],
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.client, self.on_switch = client, on_switch
        self.torch_version = client.torch_version
        self.switched = any(key in environ for key in USER_KEYS)  # the user's own settings stay
        self._stalled: tuple[ProbeRequest, ProbeOutcome] | None = None

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        if self._stalled is not None and not self.switched:
            self.switched = True
            self.client.reopen(YIELDING_ENV)
            self.on_switch(switch_note(*self._stalled))
        outcome = self.client.run(request)
        if self._stalled is None and _judged(request) and stalled(outcome):
            self._stalled = (request, outcome)
        return outcome

    def close(self) -> None:
        self.client.close()


def _judged(request: ProbeRequest) -> bool:
    """Whether a request's wait for a core says the machine is busy: a probe of one process. Not a distributed
    probe's (its ranks split the cores between them, one thread each on the two cores here, and wait on each
    other by design), nor the command's own operations: the model's inspection, or the forked half of the job's
    fresh-process measurement, which runs as the job's fresh Python, started beside the probe server, ends (its
    three steps at batch 2 read 27-56 % of their time waiting in five of six of the quadratic workload's tunes
    here, and the server restarted for it: about 1.5 s of a 6 s tune; docs/measurements/busy-threads.md)."""
    return request.op == "probe" and request.strategy == "none"


def stalled(outcome: ProbeOutcome) -> bool:
    """The probe's threads waited for a core long enough that spinning ones stall (CPU only), over at least
    one full step: a probe whose first allocation failed reads a share of a few milliseconds (the
    quadratic example's miss at batch 4572 read 33 % on a quiet machine, and the tune said another process
    was busy)."""
    return outcome.cpu_wait is not None and outcome.cpu_wait >= STALLED_WAIT and outcome.steps >= 1


def switch_note(request: ProbeRequest, outcome: ProbeOutcome) -> Circumstance:
    """The warning on the switch: the machine's load when the run measured, not a fact of its answer."""
    wait = outcome.cpu_wait or 0.0
    return Circumstance(
        f"another process kept the CPU busy: the probe at batch {request.batch_size} waited for a core "
        f"{wait:.0%} of its time, so the probes after it ran with OMP_WAIT_POLICY=PASSIVE (torch's threads "
        "sleep instead of spinning while they wait; a busy core stalls spinning ones: a gpt step ran 9x "
        "slower here); memory is the same, step times are slower than a quiet machine's and are compared only "
        "with each other; set OMP_WAIT_POLICY yourself to keep your own"
    )
