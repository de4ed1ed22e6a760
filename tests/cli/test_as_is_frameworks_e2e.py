"""Framework scripts run as they are, end to end: the real command on Hugging Face's ``Trainer``, Lightning's
``Trainer.fit`` and an accelerate loop (examples/as_is/), on the CPU device under 1 GiB.

Each is tuned in a few probes to an exact maximum of its one combination (``script/script``); ``check`` at that
maximum fits, and at a clearly larger batch does not (the OOM exit code); no process of the script survives
either command. Each framework wraps the optimizer step its own way (Lightning passes the forward and backward
as the step's closure; the ``Trainer`` and accelerate call it through ``AcceleratedOptimizer``): the probe sees
the steps of the ``torch.optim.Optimizer`` inside all the same.
"""

from __future__ import annotations

import json

import psutil
import pytest
from support import EXAMPLES, run_cli

from autobatch.errors import EXIT_OOM

pytestmark = [pytest.mark.slow, pytest.mark.consumers]

PLACEHOLDER = ("--", "--batch-size", "{batch}")
CPU = ("--device", "cpu", "--memory", "1GiB")


def _survivors(script: str) -> list[str]:
    """Processes of the script still alive: the test's own descendants, and any process that names it."""
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] in mine or script in cmdline:
            left.append(cmdline)
    return left


def _check(script: str, batch: int):
    proc = run_cli("check", script, "--batch-size", str(batch), *CPU, "--json", *PLACEHOLDER)
    assert not _survivors(script), _survivors(script)
    return proc


@pytest.mark.parametrize(
    "name, library",
    [("hf_trainer", "transformers"), ("lightning_fit", "lightning"), ("accelerate_loop", "accelerate")],
)
def test_framework_script_tuned_as_is_and_confirmed_by_check(name: str, library: str, tmp_path) -> None:
    pytest.importorskip(library)
    script = str(EXAMPLES / "as_is" / f"{name}.py")
    proc = run_cli(
        "tune", script, *CPU, "--no-cache", "--output", str(tmp_path / "r.json"), "--json", *PLACEHOLDER
    )
    assert proc.returncode == 0, proc.stderr
    assert not _survivors(script), _survivors(script)
    result = json.loads(proc.stdout)
    (combo,) = result["combinations"]
    print(f"{name}: max {combo['max_batch_size']}, {combo['probes']} probes, {result['wall_seconds']:.0f} s")
    assert (combo["precision"], combo["optimizer"], combo["recompute"]) == ("script", "script", False)
    assert combo["status"] == "exact" and combo["probes"] <= 6, combo
    b_max = combo["max_batch_size"]
    assert 30 <= b_max <= 600, b_max

    fits = _check(script, b_max)
    assert fits.returncode == 0, fits.stderr
    report = json.loads(fits.stdout)
    assert report["fits"] and report["steps"] == 10, report
    # Lightning's step runs its forward and backward in the closure: the gradients are read after it
    assert report["static_bytes"]["gradients"] > 0, report["static_bytes"]

    larger = int(b_max * 1.25) + 8
    miss = _check(script, larger)
    assert miss.returncode == EXIT_OOM, miss.stderr
    report = json.loads(miss.stdout)
    assert not report["fits"] and report["kind"] == "oom", report
