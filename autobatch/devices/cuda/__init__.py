"""The CUDA device, in three parts that each do one kind of work.

``budget``   pure arithmetic: the snapshot and budget records, the budget, the verdict on a step
``nvml``     pynvml: torch's device in NVML (UUID, PCI bus id, MIG), per-process memory
``runtime``  torch.cuda: read the device, cap the allocator, read a step's counters

Import the part you need; the names below are re-exported for callers that use them from here.
Importing any of them imports neither torch nor pynvml.
"""

from __future__ import annotations

from autobatch.devices.cuda.budget import MEMORY_DEFINITION, CudaSnapshot, allocator_mismatches, cuda_budget

__all__ = ["MEMORY_DEFINITION", "CudaSnapshot", "allocator_mismatches", "cuda_budget"]
