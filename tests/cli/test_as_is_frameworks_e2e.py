"""Framework scripts run as they are, end to end: the real command on Hugging Face's ``Trainer``, Lightning's
``Trainer.fit`` and an accelerate loop (examples/as_is/), on the CPU device: the ``Trainer`` under 1 GiB, the
others under 544 MiB, some 100-150 MiB above what their process holds with the framework imported (under 1 GiB
their maxima are 4-5 times larger, and so is every probe's work).

Each is tuned in a few probes to an exact maximum of its one combination (``script/script``); ``check`` at that
maximum fits, and at a clearly larger batch does not (the OOM exit code; both in one command); no process of the script survives
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
#: Six steps in the confirmation and in each check, not ten: six is what the leak check reads, and every step
#: at the maximum is the costliest work of the test.
STEPS = 6
#: A probe's data memory with the framework imported and batch 8, measured 2026-11-28 under 1 GiB: Lightning
#: 404 MiB (1.8 MiB more per sample), accelerate 422 MiB (9.3 more per sample), the Trainer 635 MiB (4.3 more).
#: The Trainer keeps 1 GiB: under 800 MiB (a maximum of 28) its search took 7 probes, not fewer seconds.
#: Each script's cap, and the smallest plausible maximum under it (measured: 75, 58 and 15).
CAPS = {"hf_trainer": ("1GiB", 30), "lightning_fit": ("544MiB", 30), "accelerate_loop": ("544MiB", 8)}


def _cpu(memory: str) -> tuple[str, ...]:
    return ("--device", "cpu", "--memory", memory)


def _survivors(script: str) -> list[str]:
    """Processes of the script still alive: the test's own descendants, and any process that names it."""
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] in mine or script in cmdline:
            left.append(cmdline)
    return left


def _check(script: str, batches: tuple[int, ...], memory: str):
    sizes = [flag for batch in batches for flag in ("-b", str(batch))]
    proc = run_cli("check", script, *sizes, *_cpu(memory), "--steps", str(STEPS), "--json", *PLACEHOLDER)
    assert not _survivors(script), _survivors(script)
    return proc


@pytest.mark.parametrize(
    "name, library",
    [("hf_trainer", "transformers"), ("lightning_fit", "lightning"), ("accelerate_loop", "accelerate")],
)
def test_framework_script_tuned_as_is_and_confirmed_by_check(name: str, library: str, tmp_path) -> None:
    pytest.importorskip(library)
    script, (memory, lowest) = str(EXAMPLES / "as_is" / f"{name}.py"), CAPS[name]
    proc = run_cli(
        "tune",
        script,
        *_cpu(memory),
        "--no-cache",
        "--confirm-steps",
        str(STEPS),
        "--output",
        str(tmp_path / "r.json"),
        "--json",
        *PLACEHOLDER,
    )
    assert proc.returncode == 0, proc.stderr
    assert not _survivors(script), _survivors(script)
    result = json.loads(proc.stdout)
    (combo,) = result["combinations"]
    print(f"{name}: max {combo['max_batch_size']}, {combo['probes']} probes, {result['wall_seconds']:.0f} s")
    assert (combo["precision"], combo["optimizer"], combo["recompute"]) == ("script", "script", False)
    assert combo["status"] == "exact" and combo["probes"] <= 6, combo
    b_max = combo["max_batch_size"]
    assert lowest <= b_max <= 600, b_max

    # the maximum and a clearly larger batch in one command (a probe each, one probe server)
    larger = int(b_max * 1.25) + 8
    both = _check(script, (b_max, larger), memory)
    assert both.returncode == EXIT_OOM, both.stderr
    report, miss = json.loads(both.stdout)
    assert report["fits"] and report["steps"] == STEPS, report
    # Lightning's step runs its forward and backward in the closure: the gradients are read after it
    assert report["static_bytes"]["gradients"] > 0, report["static_bytes"]
    assert not miss["fits"] and miss["kind"] == "oom", miss
