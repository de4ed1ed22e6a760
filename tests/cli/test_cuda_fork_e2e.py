"""A probe server whose warm imports leave its forks unable to use CUDA starts again with torch alone.

A library that calls ``torch.cuda.is_available()`` as it loads starts CUDA's driver on a torch built with CUDA, and
torch then refuses CUDA in every process forked afterwards ("Cannot re-initialize CUDA in forked subprocess"),
while ``torch.cuda.is_initialized()`` stays False: every CUDA probe forked from a server that warmed it would fail.
The torch here is a CPU build; ``tests/libs/gpukernels`` stands in for the CUDA build's calls (its docstring says
how), so the server's check and its restart run for real, through the command, on the CPU device.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support import ROOT, SCRIPTS, run_cli

LIBS = Path(__file__).resolve().parent.parent / "libs"


def test_the_fork_check_sees_a_driver_started_without_a_context() -> None:
    import subprocess
    import sys

    code = (
        "import torch\nfrom autobatch.devices.cuda.runtime import fork_breaks_cuda\n"
        "before = fork_breaks_cuda()\nimport gpukernels\n"
        "print(repr(before)); print(torch.cuda.is_initialized()); print(fork_breaks_cuda())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(LIBS)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    before, initialized, after = out.stdout.splitlines()
    assert (before, initialized) == ("None", "False")  # torch.cuda.is_initialized() alone misses it
    assert after.startswith("started CUDA's driver (torch.cuda.is_available()"), after


@pytest.mark.slow  # starts a probe server
def test_a_library_that_asks_for_cuda_at_import_is_imported_by_each_probe(tmp_path: Path) -> None:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(LIBS)]), "TMPDIR": str(tmp_path)}
    done = run_cli(
        "check", str(SCRIPTS / "gpu_library_user.py"), "--device", "cpu", "--memory", "600MiB",
        "--batch-size", "16", "--steps", "3", "--no-cache", "--json", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["fits"]
    told = " ".join(done.stderr.split())
    assert (
        "probe processes start from a server that imported torch only: after importing gpukernels the server "
        "started CUDA's driver (torch.cuda.is_available() without PYTORCH_NVML_BASED_CUDA_CHECK=1"
    ) in told, told
