"""Scripts run as they are, end to end: the real command on unmodified scripts on the CPU device.

The acceptance of "the training script you already have" (parts 1-3): the plain loop is tuned in a few probes,
``check`` in the same mode confirms its maximum, the maximum is its three-function twin's within the CPU
margin, and each way a script can fail a probe is a clear answer with its exit code.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest
from support import EXAMPLES, SCRIPTS, run_cli

from autobatch.devices.budget import margin_bytes
from autobatch.errors import EXIT_OOM, EXIT_SCRIPT

pytestmark = pytest.mark.slow

AS_IS = SCRIPTS / "as_is"
PLACEHOLDER = ("--", "--batch-size", "{batch}")
CPU = ("--device", "cpu", "--memory", "512MiB")  # half the probe time of 1 GiB, the same questions


def _tune(script, *extra: str, tmp_path) -> dict:
    proc = run_cli(
        "tune", str(script), *CPU, "--no-cache", "--output", str(tmp_path / "r.json"), "--json", *extra
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _check(script, batch: int, *extra: str):
    return run_cli("check", str(script), "--batch-size", str(batch), *CPU, "--json", *extra, *PLACEHOLDER)


def test_plain_loop_tuned_as_is_confirmed_by_check_and_its_twin_and_a_variant_beside_it(tmp_path) -> None:
    # one tune answers both questions: the plain loop as it is, and plain_loop.py --layers 2 beside it (half
    # the activations of its default 4 blocks: more samples in the memory)
    data = _tune(
        EXAMPLES / "as_is" / "plain_loop.py", "--objective", "max-batch", "--variant", "shallow=--layers 2",
        "--emit", f"args={tmp_path / 'run.sh'}", *PLACEHOLDER, tmp_path=tmp_path,
    )  # fmt: skip
    combo, shallow = data["combinations"]
    assert (combo["precision"], combo["optimizer"], combo["recompute"]) == ("script", "script", False)
    assert combo["status"] == "exact" and combo["probes"] <= 6, combo
    b_max = combo["max_batch_size"]
    assert any("runs as it is" in note for note in data["notes"])

    assert shallow["precision"] == "script:shallow" and shallow["status"] == "exact", shallow
    assert shallow["max_batch_size"] > 1.3 * b_max, (combo, shallow)
    assert data["chosen"]["precision"] == "script:shallow"
    line = (tmp_path / "run.sh").read_text().splitlines()[-1]
    assert line.endswith(f"--batch-size {data['chosen']['micro_batch_size']} --layers 2"), line

    fits = _check(EXAMPLES / "as_is" / "plain_loop.py", b_max)
    assert fits.returncode == 0, fits.stderr
    report = json.loads(fits.stdout)
    assert report["fits"] and report["steps"] == 10 and report["precision"] == "script"

    twin = _tune(
        AS_IS / "plain_loop_twin.py", "-p", "32-true", "-o", "adamw", "--no-recompute", tmp_path=tmp_path
    )["combinations"][0]
    slope = twin["bytes_per_sample"] or combo["bytes_per_sample"]
    within = math.ceil(margin_bytes("cpu", data["device"]["budget_bytes"]) / slope)
    assert abs(twin["max_batch_size"] - b_max) <= within, (twin["max_batch_size"], b_max, within)


def test_ends_before_its_first_step_shows_its_last_lines(tmp_path) -> None:
    proc = _check(AS_IS / "ends_early.py", 8)
    assert proc.returncode == EXIT_SCRIPT, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "ends_early.py ended (exit code 4) before its first optimizer step" in err
    assert "no data found under ./data: giving up" in err
    assert "Traceback" not in err


def test_too_little_data_says_so_and_nothing_of_memory(tmp_path) -> None:
    proc = run_cli(
        "tune", str(AS_IS / "short_data.py"), *CPU, "--output", str(tmp_path / "r.json"), *PLACEHOLDER
    )
    assert proc.returncode == EXIT_SCRIPT, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "after 2 optimizer step(s)" in err and "not enough data" in err
    assert "says nothing about memory" in err
    # a script with a fixed number of steps ends the same way at every batch size: named too, not only data
    assert "or a number of steps of its own (a --steps or --max-steps argument)" in err


def test_no_optimizer_step_seen(tmp_path) -> None:
    def check(script: str) -> str:
        proc = run_cli("check", str(AS_IS / script), "--batch-size", "8", *CPU, "--timeout", "8",
                       "--batch-env", "BATCH")  # fmt: skip
        assert proc.returncode == EXIT_SCRIPT, proc.stderr
        return " ".join(proc.stderr.split())

    slow = check("slow_start.py")
    assert "no optimizer step seen within" in slow
    assert "not a torch.optim.Optimizer" in slow
    # an update of its own is told apart after a few backward passes, not at the timeout
    assert "no torch.optim optimizer: the script ran 5 backward passes" in check("no_step.py")


def test_an_oom_the_script_catches_does_not_fit(tmp_path) -> None:
    proc = _check(AS_IS / "catches_oom.py", 50000)
    assert proc.returncode == EXIT_OOM, proc.stderr
    report = json.loads(proc.stdout)
    assert not report["fits"] and report["kind"] == "oom"
    assert "whether or not the script would catch it" in report["reason"]


def test_workers_not_counted_finder_warned_and_nothing_survives() -> None:
    # The DataLoader's workers share tensors through sockets in multiprocessing's folder, whose path a socket's
    # must hold (107 bytes): a temporary folder of the test's own, short as the system's is, not under tmp_path.
    # The job's fresh process is measured, as users run: its forked half, ended with its workers, reports once
    # (their ending raised through the DataLoader's SIGCHLD handler into the script, which reported again).
    temp = Path(tempfile.mkdtemp(prefix="ab-"))
    try:
        # two probes, each ended by os._exit, never by multiprocessing's cleanup
        sizes = ("-b", "64", "-b", "32")
        env = {"TMPDIR": str(temp), "AUTOBATCH_FRESH_BASELINE": "true"}
        proc = run_cli("check", str(AS_IS / "workers.py"), *sizes, *CPU, *PLACEHOLDER, env=env)
        assert proc.returncode == 0, proc.stderr
        assert not [name for name in os.listdir(temp) if name.startswith("pymp-")], os.listdir(temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    err = " ".join(proc.stderr.split())
    assert "started 2 process(es) of its own" in err and "not counted" in err
    assert "find_executable_batch_size" in err and "autobatch replaces it" in err
    assert "could not be measured" not in err, err
    left = [
        p for p in psutil.process_iter(["cmdline"]) if "as_is/workers.py" in " ".join(p.info["cmdline"] or [])
    ]
    assert not left, [p.info["cmdline"] for p in left]


def test_a_batch_above_the_script_s_data_names_the_data_and_the_fix() -> None:
    """A batch larger than the script's dataset is one batch of the dataset an epoch: the script ran out of steps,
    and the error says how many samples its DataLoader holds and what to tune with, not only "not enough data"."""
    proc = _check(AS_IS / "small_data.py", 1000)
    assert proc.returncode == EXIT_SCRIPT, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "its DataLoader holds 600 samples, fewer than the batch" in err, err
    assert "a batch above 600 is 600 in this job" in err and "--max-batch-size 600" in err, err


def test_a_temporary_folder_too_deep_for_sockets_is_named_and_the_probes_answer() -> None:
    """A TMPDIR deeper than multiprocessing's sockets allow (a socket's path holds 107 bytes) hangs a
    DataLoader's workers, in the job as in a probe (before: the job's fresh process and the probe each ran out
    their timeout, and the command exited 3 with no optimizer step seen). The command names the folder and the
    fix, and its probes, their sockets in a short folder, answer."""
    deep = Path(tempfile.mkdtemp(prefix="ab-")) / ("d" * 90)
    deep.mkdir()
    try:
        env = {"TMPDIR": str(deep), "AUTOBATCH_FRESH_BASELINE": "true"}
        args = ("check", str(AS_IS / "workers.py"), "-b", "16", *CPU, "--timeout", "60", *PLACEHOLDER)
        proc = run_cli(*args, env=env)
        assert proc.returncode == 0, proc.stderr
        assert not [name for name in os.listdir(deep) if name.startswith("pymp-")], os.listdir(deep)
    finally:
        shutil.rmtree(deep.parent, ignore_errors=True)
    err = " ".join(proc.stderr.split())
    assert f"the temporary folder ({deep}, {len(str(deep))} characters; TMPDIR)" in err, err
    assert "leaves multiprocessing's sockets no room" in err and "export TMPDIR=/tmp" in err, err
    assert "could not be measured" not in err, err


def test_a_maximum_counted_as_the_jobs_fresh_process_holds_in_one(tmp_path, monkeypatch) -> None:
    """The CPU device's fresh-process offset is measured for a script run as it is (the conftest turns it
    off for the other tests): the maximum lies within 1 % above the independent harness's, which runs the script
    in a fresh process under the same cap (tests/harness/as_is_process.py, no autobatch code), and no further
    below it than the CPU margin and one sample (issue 33's bound, a sample's worth for the offset's own noise).
    Here (460.8 MiB, 1.75 MiB a sample) the answer is 86 and the harness fits 88 (459.0 MiB); 89 peaks within
    30 KB of the cap, so it fits one fresh process in a few: a fixed "3 % below" (89 must not fit) failed CI
    twice on that edge."""
    from harness.as_is_process import fits_as_is

    monkeypatch.delenv("AUTOBATCH_FRESH_BASELINE")
    script = EXAMPLES / "as_is" / "plain_loop.py"
    data = _tune(script, *PLACEHOLDER, tmp_path=tmp_path)
    assert len(data["device"]["fresh_process"]["offset_bytes"]) == 1
    assert any("probes count as the job's fresh process" in note for note in data["notes"])
    b_max, budget = data["combinations"][0]["max_batch_size"], data["device"]["budget_bytes"]
    # what a failure needs to be read: the offset measured, the probes and the notes (a machine's load moves them)
    said = json.dumps(
        {"max": b_max, "fresh": data["device"]["fresh_process"], "notes": data["notes"],
         "trace": [(t["batch_size"], t["kind"], t["peak_bytes"], t["steps"]) for t in data["combinations"][0]["trace"]]}
    )  # fmt: skip
    assert fits_as_is(script, ["--batch-size", str(math.ceil(b_max / 1.01))], budget), (
        f"more than 1 % above: {said}"
    )
    per_sample = data["combinations"][0]["bytes_per_sample"]
    below = b_max + math.ceil(margin_bytes("cpu", budget) / per_sample) + 2
    assert not fits_as_is(script, ["--batch-size", str(below)], budget), f"more than the margin below: {said}"


def test_gradient_accumulation_of_the_scripts_own_is_said(tmp_path) -> None:
    proc = _check(AS_IS / "accumulates.py", 16)
    assert proc.returncode == 0, proc.stderr
    assert "runs 4 backward passes per optimizer step" in " ".join(proc.stderr.split())
    plain = run_cli(
        "check", str(AS_IS / "accumulates.py"), "--batch-size", "16", *CPU, "--", "--batch-size", "{batch}",
        "--accumulate", "1",
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert "backward passes per optimizer step" not in plain.stderr
