"""The CUDA device in a probe process (:class:`~autobatch.devices.backend.DeviceBackend`).

The caching allocator capped at the budget, its peak reservation read and reset, and after the steps the
allocator's counters with NVML's figure for the process judged against the request (:func:`cuda_verdict`).
Written against PyTorch's documented ``torch.cuda`` API through :mod:`.runtime`; not run on a GPU here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from autobatch.devices.cuda import runtime
from autobatch.devices.cuda.budget import CudaStepStats, judge_step
from autobatch.devices.cuda.nvml import open_nvml

if TYPE_CHECKING:
    from autobatch.records.protocol import ProbeOutcome, ProbeRequest


class CudaBackend:
    """CUDA device ``index`` (each rank has its own device: nothing is shared, no offset is measured)."""

    fresh_process_differs = False
    job_environment: Mapping[str, str] = {}
    ranks_share_memory = False

    def __init__(self, index: int) -> None:
        self.index = index
        self.request: ProbeRequest | None = None

    def apply(self, request: ProbeRequest, outcome: ProbeOutcome) -> None:
        import torch

        self.request = request
        torch.cuda.set_device(self.index)
        runtime.apply_budget_bytes(request.budget_bytes, self.index)
        runtime.reset_peaks(self.index)
        outcome.baseline_bytes = int(torch.cuda.memory_reserved(self.index))

    def peak(self) -> int:
        import torch

        return int(torch.cuda.max_memory_reserved(self.index))

    def synchronize(self) -> None:
        runtime.synchronize(self.index)

    def finish(self, outcome: ProbeOutcome) -> None:
        assert self.request is not None, "apply() first"
        with open_nvml(*runtime.device_ids(self.index)) as nvml:  # no NVML: no process figure
            stats = runtime.read_step_stats(self.index, nvml)
        outcome.device_stats = stats.to_dict()
        outcome.kind, outcome.reason = cuda_verdict(outcome, stats, self.request)

    def load_meter(self) -> Callable[[], float | None]:
        """Not measured: a GPU shared with another process would not show in the threads' waits."""
        return lambda: None

    def facts(self, precisions: tuple[str, ...] = ()) -> dict[str, Any]:
        """The device's snapshot and the precisions its compute capability cannot run (every one asked or
        not: the card decides, not a trial step)."""
        snapshot = runtime.snapshot_dict(self.index)
        unsupported = {k: v for k, v in runtime.capabilities(self.index).items() if v}
        return {"snapshot": snapshot, "unsupported_precisions": unsupported}


def cuda_verdict(
    outcome: ProbeOutcome, stats: CudaStepStats, request: ProbeRequest
) -> tuple[str, str | None]:
    """A CUDA probe's kind and reason after judging its stats: a fit that was too tight is an OOM.

    Judged against the request's budget and, where both are known, NVML's figure for the process
    against the request's per-process limit.
    """
    if outcome.kind != "fits":
        return outcome.kind, outcome.reason
    fits, reason = judge_step(stats, request.budget_bytes, request.process_limit_bytes)
    return ("fits", outcome.reason) if fits else ("oom", reason)
