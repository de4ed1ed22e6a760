"""The guard in a real job on the CPU device: real out-of-memory failures under RLIMIT_DATA, in subprocesses.

A varying-length classifier (tests/scripts/guard/varying_lengths.py) whose 150th batch holds sequences of
2048 tokens, against typical ones of 4 to 23, under a 320 MiB cap on its data memory (about 256 MiB are
torch and the script). At a micro-batch of 8 the long batch needs about 80 MiB more; at 4 it fits. float64
throughout, so that two splits of the same batch agree to far below 1e-5. The model is small (one encoder
layer of width 32), so that the 200 steps cost little beside the processes' start.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "guard" / "varying_lengths.py"
CAP_MIB = 320
ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
COMMON = ["--long-length", "2048", "--long-step", "149", "--steps", "200"]


def _capped(cap_mib: int | None):  # noqa: ANN202 - a preexec_fn
    def apply() -> None:
        if cap_mib is not None:
            cap = cap_mib << 20
            resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))

    return apply


def start(tmp: Path, name: str, args: list[str], cap_mib: int | None = CAP_MIB) -> subprocess.Popen[str]:
    env = {**os.environ, **ENV, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = ["--out", str(tmp / f"{name}.pt"), "--step-log", str(tmp / f"{name}.jsonl")]
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *COMMON, *args, *out],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_capped(cap_mib),
    )


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def steps(path: Path) -> list[dict[str, int]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def max_relative_difference(a: Path, b: Path) -> float:
    import torch

    left, right = torch.load(a), torch.load(b)
    assert left.keys() == right.keys()
    return max(float((left[k] - right[k]).abs().max() / right[k].abs().max().clamp_min(1e-12)) for k in left)


@pytest.mark.slow
def test_the_guard_survives_the_long_batch_keeps_the_batch_and_grows_back(tmp_path: Path) -> None:
    bare = start(tmp_path, "bare", ["--micro-batch", "8"])
    guarded = start(
        tmp_path,
        "guarded",
        ["--micro-batch", "8", "--sizes", "2,4,6,8", "--guard", "--events", str(tmp_path / "events.jsonl")],
    )
    reference = start(tmp_path, "reference", ["--micro-batch", "4"])  # never runs out: 4 fits the long batch

    code, out = finish(bare)
    assert code != 0 and "DefaultCPUAllocator" in out, out[-2000:]
    assert len(steps(tmp_path / "bare.jsonl")) == 149  # died at the long batch

    code, out = finish(guarded)
    assert code == 0, out[-3000:]
    log = steps(tmp_path / "guarded.jsonl")
    assert [r["step"] for r in log] == list(range(200))
    assert {r["samples"] for r in log} == {16}  # the batch per optimizer step, unchanged at every step
    assert log[149]["micro_batch"] < 8 and log[148]["micro_batch"] == 8
    back = next(r["step"] for r in log[150:] if r["micro_batch"] == 8)
    assert back - 149 <= 50

    events = steps(tmp_path / "events.jsonl")
    lowered = [e for e in events if e["event"] == "micro-batch" and e["new"] < e["old"]]
    assert lowered and all(e["step"] == 149 and e["reason"] == "out of memory" for e in lowered)
    assert lowered[0]["shapes"][0] == [16, 2048]
    assert [(e["old"], e["new"]) for e in lowered] == [(8, 6), (6, 4), (4, 2)][: len(lowered)]
    summary = events[-1]
    assert (
        summary["event"] == "summary" and summary["steps"] == 200 and summary["peak_bytes"] <= CAP_MIB << 20
    )

    code, out = finish(reference)
    assert code == 0, out[-3000:]
    assert max_relative_difference(tmp_path / "guarded.pt", tmp_path / "reference.pt") <= 1e-5


@pytest.mark.slow
def test_the_recorded_peak_stays_under_the_cap_after_a_mapping_closed_before_the_guard(
    tmp_path: Path,
) -> None:
    """The CPU's high-water mark (VmPeak) cannot be reset, and a job's process has a past: here a 512 MiB
    token file mapped and closed before the guard's first batch, which raised VmPeak far above the process's
    size. The guard's peak is its own period's, under the cap the job ran within."""
    import torch

    head = torch.randint(
        1, 500, (20 * 8 * 32,), dtype=torch.int16, generator=torch.Generator().manual_seed(0)
    )
    with open(tmp_path / "train.bin", "wb") as handle:
        handle.write(head.numpy().tobytes())
        handle.truncate(512 << 20)  # the rest of the corpus: a sparse file, mapped but never read
    env = {**os.environ, **ENV, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "mapped_tokens.py"), "--tokens", "train.bin"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=_capped(CAP_MIB),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["steps"] == 20
    assert 100 << 20 < summary["peak_bytes"] <= CAP_MIB << 20


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(tmp_path: Path, strategy: str) -> tuple[str, list[list[tuple[int, int, int, str]]]]:
    """Two gloo ranks of the script under ``strategy`` where only rank 1 gets the long batch (step 15 of
    30): each rank's moves, after checking that neither hung and both finished at the start size."""
    import signal

    args = [
        *("-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port())),
        *(str(SCRIPT), strategy, "--steps", "30", "--long-step", "15", "--long-rank", "1"),
        *("--long-length", "2048", "--micro-batch", "8", "--sizes", "2,4,6,8", "--grow-after", "5"),
        "--guard",
        *("--events", str(tmp_path / "events{rank}.jsonl"), "--out", str(tmp_path / "params{rank}.pt")),
        *("--step-log", str(tmp_path / "steps{rank}.jsonl")),
    ]
    # torchrun leaves a torchelastic_* folder in its TMPDIR: the test's, not the machine's
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, **ENV, "PYTHONPATH": str(Path(__file__).parents[2]), "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_capped(CAP_MIB + 20),  # each rank: gloo's threads and buffers on top
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the ranks hung:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]

    moves = []
    for rank in (0, 1):
        events = [e for e in steps(tmp_path / f"events{rank}.jsonl") if e["event"] == "micro-batch"]
        moves.append([(e["step"], e["old"], e["new"], e["reason"]) for e in events])
        sizes = [r["micro_batch"] for r in steps(tmp_path / f"steps{rank}.jsonl")]
        assert len(sizes) == 30 and sizes[15] < 8 and sizes[14] == 8 and sizes[-1] == 8
    return out, moves


def assert_lowered_together(tmp_path: Path, moves: list[list[tuple[int, int, int, str]]]) -> None:
    import torch

    assert moves[0] == moves[1]  # rank 0 lowered with rank 1, though its own batch was short
    assert any(reason == "out of memory" for _, _, _, reason in moves[0])
    shapes0 = steps(tmp_path / "events0.jsonl")[0]["shapes"][0]
    assert shapes0[1] < 2048  # rank 0's batch was short: it lowered because rank 1 ran out
    assert steps(tmp_path / "events1.jsonl")[0]["shapes"][0][1] == 2048

    left, right = torch.load(tmp_path / "params0.pt"), torch.load(tmp_path / "params1.pt")
    assert left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


@pytest.mark.slow
def test_two_ddp_ranks_lower_together_when_only_rank_1_runs_out(tmp_path: Path) -> None:
    _, moves = run_ranks(tmp_path, "--ddp")
    assert_lowered_together(tmp_path, moves)


@pytest.mark.slow
def test_two_fsdp2_ranks_lower_together_when_only_rank_1_runs_out(tmp_path: Path) -> None:
    """FSDP2 runs all-gathers in the forward and reduce-scatters in the backward: rank 0 is inside that
    flow when rank 1 runs out, and leaves it at its next collective's check."""
    _, moves = run_ranks(tmp_path, "--fsdp")
    assert_lowered_together(tmp_path, moves)  # the full parameters, gathered on each rank
