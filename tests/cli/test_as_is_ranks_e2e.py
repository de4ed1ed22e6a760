"""A torchrun-style script run as it is on several ranks, through the real command (2 gloo ranks, CPU).

``examples/as_is/ddp_torchrun.py`` joins its process group itself (``env://``) and wraps its model in DDP:
``--nproc-per-node 2`` starts it twice with torchrun's environment, every rank measured, ``{batch}`` the
per-rank micro-batch; ``check`` confirms the maximum on both ranks and that a larger batch does not fit; a
rank that fails ends every rank with its own error; no process of the script outlives the command.
"""

from __future__ import annotations

import json
import shlex
import socket
import sys
import uuid

import psutil
import pytest
from support import EXAMPLES, SCRIPTS, run_cli

from autobatch.devices.cpu import MALLOC_ENV
from autobatch.errors import EXIT_OOM, EXIT_SCRIPT

pytestmark = pytest.mark.slow

#: 512 MiB per rank, some 150 MiB above what a rank holds before its steps: the example's maximum under 1 GiB
#: is a few hundred samples; here some tens, for a fifth of every probe's work and the same questions.
RANKS = ("--device", "cpu", "--memory", "512MiB", "--nproc-per-node", "2")
PLACEHOLDER = ("--", "--batch-size", "{batch}")


def _left(mark: str) -> list[int]:
    """Processes still running that a command with ``AUTOBATCH_TEST_MARK=mark`` started."""
    left = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("AUTOBATCH_TEST_MARK") == mark:
                left.append(process.pid)
        except psutil.Error:
            pass
    return left


def test_a_ddp_script_is_tuned_on_its_ranks_and_checked(tmp_path) -> None:
    mark = uuid.uuid4().hex
    env = {"AUTOBATCH_TEST_MARK": mark}
    script = str(EXAMPLES / "as_is" / "ddp_torchrun.py")
    out = tmp_path / "r.json"
    tuned = run_cli(
        "tune", script, *RANKS, "--no-cache", "--output", str(out), "--json", *PLACEHOLDER, env=env
    )
    assert tuned.returncode == 0, tuned.stderr
    data = json.loads(tuned.stdout)
    (combo,) = data["combinations"]
    assert combo["status"] == "exact" and combo["probes"] <= 6, combo
    assert (data["distributed"]["strategy"], data["distributed"]["nproc_per_node"]) == ("ddp", 2)
    assert data["chosen"]["world_size"] == 2 and data["chosen"]["nproc_per_node"] == 2
    b_max = combo["max_batch_size"]
    print(f"max batch {b_max} per rank, {combo['probes']} probes")
    assert 16 <= b_max <= 600, b_max

    larger = b_max + max(8, b_max // 10)  # the maximum and a larger batch in one command, a probe each
    both = run_cli(
        "check", script, "-b", str(b_max), "-b", str(larger), *RANKS, "--json", *PLACEHOLDER, env=env
    )
    assert both.returncode == EXIT_OOM, both.stderr
    report, over = json.loads(both.stdout)
    assert report["fits"] and report["steps"] == 10, report
    assert "rank 0" in both.stderr and "rank 1" in both.stderr  # every rank's peak is shown
    assert not over["fits"] and over["batch_size"] == larger, over
    assert not _left(mark)


def test_a_rank_that_fails_ends_every_rank_with_its_error() -> None:
    mark = uuid.uuid4().hex
    script = str(SCRIPTS / "as_is" / "ddp_rank_fails.py")
    proc = run_cli(
        "check", script, "--batch-size", "8", *RANKS, "--timeout", "120", *PLACEHOLDER,
        env={"AUTOBATCH_TEST_MARK": mark}, timeout=100,
    )  # fmt: skip
    assert proc.returncode == EXIT_SCRIPT, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "[rank 1 of 2] rank 1 could not open its shard" in err
    assert "Traceback" not in err
    assert not _left(mark)


def test_a_launchers_variables_for_rank_1_leave_each_probe_a_world_of_one_and_plan_for_their_world(
    tmp_path,
) -> None:
    """A wrapper's torchrun variables name rank 1 of 2 and a rendezvous nobody hosts, and no --nproc-per-node is
    given. Each probe (and the job's fresh process) runs the script as rank 0 of a world of one instead of waiting
    in ``init_process_group`` until its timeout: before that fix every probe timed out (so does a regression here:
    --timeout 20, then the command's own). The plan is still for WORLD_SIZE=2 (global = micro x accumulation x 2),
    so the job's command line starts 2 processes, in the table, in --json (the plan's processes per node x nodes)
    and in the emitted files: before that fix it was ``python script.py ...``, a world of one, half the planned
    global batch. One tune answers both (it was two tunes of the same script)."""
    with socket.socket() as free:  # a port no one listens on: a probe that joins it waits
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {
        "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "AUTOBATCH_FRESH_BASELINE": "true",  # the job's fresh process too (the suite turns it off)
    }  # fmt: skip
    script = str(EXAMPLES / "as_is" / "ddp_torchrun.py")
    job, env_file = tmp_path / "job.sh", tmp_path / "autobatch.env"
    proc = run_cli(
        "tune", script, "--device", "cpu", "--memory", "600MiB", "--timeout", "20", "--no-cache",
        "--max-batch-size", "16", "--global-batch-size", "64", "--output", str(tmp_path / "r.json"),
        "--emit", f"args={job}", "--emit", f"env={env_file}", "--json", *PLACEHOLDER, env=env, timeout=150,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    (combo,) = data["combinations"]
    assert combo["max_batch_size"] == 16 and combo["probes"] <= 4, combo  # every probe fitted, none timed out
    assert data["chosen"]["world_size"] == 2 and "world size 2 from WORLD_SIZE=2" in data["notes"]
    err = " ".join(proc.stderr.split())
    assert "timed out" not in err and "rank 0 of a world of one" in err and "--nproc-per-node N" in err
    assert "probes count as the job's fresh process" in " ".join(data["notes"])  # measured, not timed out

    chosen = data["chosen"]
    assert (chosen["micro_batch_size"], chosen["accumulation_steps"], chosen["world_size"]) == (16, 2, 2)
    assert chosen["nproc_per_node"] * chosen["num_nodes"] == chosen["world_size"], chosen
    pinned = [f"{name}={value}" for name, value in MALLOC_ENV.items()]  # the allocator the answer holds under
    line = shlex.join(
        [
            *pinned,
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            script,
            "--batch-size",
            "16",
        ]
    )
    assert f"command: {line}" in err
    assert "the plan is for a world of 2 processes and its micro-batch was measured in one" in err
    assert job.read_text().splitlines()[-1] == line
    assert f"export AUTOBATCH_COMMAND={shlex.quote(line)}" in env_file.read_text().splitlines()
    # that command, run by `autobatch run` in each worker of a launcher, would start the world in each: refused
    nested = run_cli(
        "run", script, "--result", str(tmp_path / "r.json"), "--max-restarts", "0", "--device", "cpu",
        *PLACEHOLDER, env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, timeout=60,
    )  # fmt: skip
    assert nested.returncode == 2, nested.stderr
    said = " ".join(nested.stderr.split())
    assert "inside a worker of a launched job (RANK=1 LOCAL_RANK=1)" in said and "Traceback" not in said
    assert "its own world of 2 processes" in said and "micro-batch 16 and accumulation 2" in said


def test_a_result_served_from_the_cache_says_the_launchers_variables_were_the_measuring_runs(
    tmp_path,
) -> None:
    """A tune under a wrapper's torchrun variables warns of them (each probe ran as a world of one). The same tune
    without them, its world given as --world-size 2 (the same key), is served from the cache: it says that warning
    as the run that measured's, with its date, never as its own, and where its own world size came from. Before
    the fix it repeated "warning: the environment names a worker ..." and "world size 2 from WORLD_SIZE=2"."""
    script = str(EXAMPLES / "as_is" / "plain_loop.py")
    cache = str(tmp_path / "cache")
    args = ("tune", script, "--device", "cpu", "--memory", "600MiB", "--max-batch-size", "16", "--json")
    first = run_cli(
        *args, "--output", str(tmp_path / "r1.json"), *PLACEHOLDER,
        env={"WORLD_SIZE": "2", "RANK": "0", "AUTOBATCH_CACHE_DIR": cache}, timeout=150,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    measured = json.loads(first.stdout)
    launcher = "the environment names a worker of a launched job (RANK=0 WORLD_SIZE=2)"
    assert f"warning: {launcher}" in " ".join(measured["notes"]) and measured["probes"] > 0
    second = run_cli(
        *args, "--world-size", "2", "--output", str(tmp_path / "r2.json"), *PLACEHOLDER,
        env={"AUTOBATCH_CACHE_DIR": cache}, timeout=150,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    answer = json.loads(second.stdout)
    assert answer["cache"]["served"] and answer["probes"] == 0
    notes = answer["notes"]
    assert not [note for note in notes if note.startswith("warning:")], notes
    assert any(
        note.startswith(f"the run that measured, on {measured['created']}, warned: {launcher}")
        for note in notes
    ), notes
    assert "world size 2 from --world-size" in notes and "world size 2 from WORLD_SIZE=2" not in notes
    err = " ".join(second.stderr.split())
    assert "warning: the environment" not in err and f"warned: {launcher}" in err
