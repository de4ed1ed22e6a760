"""Fixture: a library that asks torch whether CUDA is there as it loads, to pick its kernels, as GPU libraries do
(``DEVICE = "cuda" if torch.cuda.is_available() else "cpu"`` at their top).

On a torch built with CUDA, that call starts CUDA's driver (``cudaGetDeviceCount``) and torch marks every process
forked afterwards as one that must not initialise CUDA ("Cannot re-initialize CUDA in forked subprocess"), while
``torch.cuda.is_initialized()`` stays False. The torch here is a CPU build, so on one this module stands in for
what the CUDA build's C++ does on a machine without a GPU (torch/csrc/cuda/Module.cpp: ``_cuda_getDeviceCount``
calls ``poison_fork``, a ``pthread_atfork`` child handler that sets the flag ``_cuda_isInBadFork`` reads): no
device counted, and the mark in every child forked after the call.
"""

from __future__ import annotations

import os

import torch

_forked_after: list[bool] = []
_registered: list[bool] = []


def _device_count() -> int:
    if not _registered:
        _registered.append(True)
        os.register_at_fork(after_in_child=lambda: _forked_after.append(True))
    return 0


if not hasattr(torch._C, "_cuda_getDeviceCount"):  # a CPU build: stand in for the CUDA build's calls
    torch._C._cuda_getDeviceCount = _device_count  # type: ignore[attr-defined]
    torch.cuda._is_in_bad_fork = lambda: bool(_forked_after)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def width() -> int:
    return 64
