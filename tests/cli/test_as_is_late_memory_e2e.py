"""Memory that arrives after a probe's first steps, in scripts run as they are: the real command, CPU device.

A GAN's generator that first steps at iteration 10, a backbone unfrozen after some steps, an update written by
hand (no torch.optim), an optimizer that steps every 100 backward passes: each probe waits for what it must see
(every optimizer the script built to have stepped), stops waiting when it cannot be seen, and says so.
"""

from __future__ import annotations

import json

import pytest
from support import SCRIPTS, run_cli

from autobatch.errors import EXIT_NOTHING_FITS, EXIT_SCRIPT

pytestmark = pytest.mark.slow

AS_IS = SCRIPTS / "as_is"
PLACEHOLDER = ("--", "--batch-size", "{batch}")


def _tune(script: str, *extra: str, tmp_path, args: tuple[str, ...] = (), memory: str = "512MiB"):
    return run_cli(
        "tune", str(AS_IS / script), "--device", "cpu", "--memory", memory, "--no-cache",
        "--output", str(tmp_path / "r.json"), "--json", *extra, *PLACEHOLDER, *args,
    )  # fmt: skip


def test_a_generator_that_first_steps_late_is_waited_for(tmp_path) -> None:
    """Its first Adam step (gradients and two moments of 21 M parameters) does not fit beside the process's
    baseline under 512 MiB at any batch: the tune waits for it and finds nothing fits (it tuned to hundreds)."""
    proc = _tune("gan_late_generator.py", tmp_path=tmp_path)
    assert proc.returncode == EXIT_NOTHING_FITS, proc.stderr[-3000:]
    probes = [line for line in proc.stderr.splitlines() if " probe script/script" in line]
    assert probes and not [line for line in probes if " fits " in line], probes
    assert "after 11 optimizer step(s)" in probes[-1]  # the critic's 11th step, then the generator's first


def test_a_late_unfreeze_is_noted_and_seen_with_longer_probes(tmp_path) -> None:
    """Under 400 MiB (about 60 MiB above the process's own memory): the maxima are small, so are the probes,
    and the unfrozen backbone's activations and Adam state still cut the frozen maximum by more than 30 %."""
    unfreeze = ("--unfreeze-after", "12")
    frozen = _tune("finetune_unfreeze.py", tmp_path=tmp_path, args=unfreeze, memory="400MiB")
    assert frozen.returncode == 0, frozen.stderr[-3000:]
    data = json.loads(frozen.stdout)
    (note,) = [n for n in data["notes"] if "frozen parameters" in n]
    assert "--steps" in note and "frozen parameters" in " ".join(frozen.stderr.split())

    seen = _tune("finetune_unfreeze.py", "--steps", "14", tmp_path=tmp_path, args=unfreeze, memory="400MiB")
    assert seen.returncode == 0, seen.stderr[-3000:]
    longer = json.loads(seen.stdout)
    assert not [n for n in longer["notes"] if "frozen parameters" in n], longer["notes"]
    before, after = data["combinations"][0]["max_batch_size"], longer["combinations"][0]["max_batch_size"]
    print(f"max batch: {before} frozen, {after} with the backbone unfrozen")
    assert after < 0.7 * before, (before, after)


def test_a_hand_written_update_stops_after_a_few_backward_passes(tmp_path) -> None:
    proc = _tune("manual_update.py", "--timeout", "30", tmp_path=tmp_path)
    assert proc.returncode == EXIT_SCRIPT, proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    assert "no torch.optim optimizer: the script ran 5 backward passes" in err, err[-3000:]
    assert "torch.optim.SGD(model.parameters()" in err
    assert "within" not in err  # not "no optimizer step seen within N s": it did not wait for the timeout


def test_training_in_a_spawned_process_is_named_not_blamed_on_the_optimizer(tmp_path) -> None:
    """A real AdamW stepping in a process ``torch.multiprocessing.spawn`` started: the probe sees no step and no
    backward pass in the script's own process. The error said an optimizer that is not a torch.optim.Optimizer
    is never seen, while the child's own lines, in the same error, counted its steps."""
    proc = _tune("spawned_loop.py", "--timeout", "20", tmp_path=tmp_path)
    assert proc.returncode == EXIT_SCRIPT, proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    assert "training in a process of its own (torch.multiprocessing.spawn" in err, err[-3000:]
    assert "--nproc-per-node" in err and "not a torch.optim.Optimizer" not in err


def test_an_optimizer_stepping_every_100_backward_passes_is_capped(tmp_path) -> None:
    proc = _tune("accumulates_100.py", "--timeout", "60", tmp_path=tmp_path)
    assert proc.returncode == EXIT_SCRIPT, proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    assert "waited for an optimizer step: the script ran 33 backward passes" in err, err[-3000:]
    assert "without a step of its AdamW" in err and "--accumulate {accum}" in err
    planned = _tune("accumulates_100.py", tmp_path=tmp_path, args=("--accumulate", "{accum}"))
    assert planned.returncode == 0, planned.stderr[-3000:]
