"""autobatch.devices.cuda.runtime: the torch.cuda calls, which only a real GPU can run.

The development machines have none: the test that applies and judges a real budget is marked ``gpu``
and skips without one. What runs everywhere: importing the CUDA path costs neither torch nor pynvml.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from autobatch.devices.cuda import runtime
from autobatch.devices.cuda.budget import cuda_budget, judge_step
from autobatch.devices.cuda.nvml import open_nvml

GiB = 1 << 30


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_real_budget_is_enforced_and_judged_on_a_gpu():
    import torch

    from autobatch.probe.oom import classify_exception

    def stats():
        with open_nvml(*runtime.device_ids(0)) as nvml:
            return runtime.read_step_stats(0, nvml)

    s = runtime.snapshot(0)
    b = cuda_budget(s, memory=min(2 * GiB, s.total_bytes - s.outside_bytes), headroom=0.1)
    runtime.apply_budget_bytes(b.budget_bytes, 0)
    try:
        runtime.reset_peaks(0)
        x = torch.empty(b.budget_bytes // 4, dtype=torch.uint8, device="cuda:0")
        runtime.synchronize(0)
        fitted = stats()
        assert fitted.max_reserved <= b.budget_bytes
        assert judge_step(fitted, b.budget_bytes, b.process_limit_bytes) == (True, None)
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(b.budget_bytes, dtype=torch.uint8, device="cuda:0")
        assert classify_exception(info.value) == "oom"
        del x
        failed = stats()
        assert failed.num_ooms >= 1 and not judge_step(failed, b.budget_bytes, b.process_limit_bytes)[0]
    finally:
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, 0)


def test_importing_the_cuda_path_and_the_classifier_imports_neither_torch_nor_pynvml():
    modules = "autobatch.probe.oom, autobatch.devices.cuda.budget, autobatch.devices.cuda.nvml, autobatch.devices.cuda.runtime"
    code = f"import sys, {modules}; print('torch' in sys.modules, 'pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
