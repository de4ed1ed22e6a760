"""One protocol for the device a probe runs on, with a CPU and a CUDA implementation.

A probe process asks its device's backend (:func:`backend_for`) to apply the request's budget, read the peak,
synchronize, finish (the device's own verdict on the steps), meter how long its threads waited for a core,
and report the facts an inspection records. The run asks it what shapes a session: whether the job's
fresh process holds more than a forked probe, whether the ranks share the device's memory, and the environment
the job's processes must start with for the answer to hold.
What is particular to one device stays in its implementation: :class:`autobatch.devices.cpu.CpuBackend`,
:class:`autobatch.devices.cuda.backend.CudaBackend`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from autobatch.records.protocol import ProbeOutcome, ProbeRequest

#: A reading started now that, called later, says how long the probe's threads waited for a core since
#: then, over the wall time (None: not measured).
LoadMeter = Callable[[], "float | None"]


class DeviceBackend(Protocol):
    """A device as a probe process holds it (one object per probe: :meth:`apply` starts it)."""

    #: The budget counts the whole probe process, so the job's fresh process holds more than a forked probe
    #: at the same step (:mod:`autobatch.probe.fresh`): the session measures the offset once.
    fresh_process_differs: bool
    #: The ranks of a distributed run share this device's memory (one machine's), so each has its share.
    ranks_share_memory: bool
    #: What the job's processes must start with for the answer to hold, as the probes did (the CPU's pinned
    #: allocator; none on CUDA, whose budget the host's heap does not count in): every plan carries it.
    job_environment: Mapping[str, str]

    def apply(self, request: ProbeRequest, outcome: ProbeOutcome) -> None:
        """Cap this process at the request's budget and start the peak from here; ``outcome`` gets the
        baseline and whatever this device records of how the steps will run."""
        ...

    def peak(self) -> int:
        """The peak since :meth:`apply`, in the quantity the budget caps."""
        ...

    def synchronize(self) -> None:
        """Wait for the device's queued work (step times and peaks are read after this)."""
        ...

    def finish(self, outcome: ProbeOutcome) -> None:
        """After the steps: the device's own figures and verdict into ``outcome``."""
        ...

    def load_meter(self) -> LoadMeter:
        """Start a reading of how long the probe's threads wait for a core."""
        ...

    def facts(self, precisions: tuple[str, ...] = ()) -> dict[str, Any]:
        """What an inspection reports of the device, with the ``precisions`` it cannot run
        (``unsupported_precisions``)."""
        ...


def backend_for(device: str) -> DeviceBackend:
    """The backend of ``device`` (``"cpu"``, ``"cuda"`` or ``"cuda:N"``); importing it imports no torch."""
    if device.startswith("cuda"):
        from autobatch.devices.cuda.backend import CudaBackend

        return CudaBackend(int(device.partition(":")[2] or 0))
    from autobatch.devices.cpu import CpuBackend

    return CpuBackend()
