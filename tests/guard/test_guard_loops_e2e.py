"""The guard in training loops as people write them, each run as a script in a subprocess against the same loop
without the guard (tests/scripts/guard/); out-of-memory failures injected with the documented test hook
(``AUTOBATCH_GUARD_FAIL_AT``), which asks the allocator for a petabyte: a real failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, SCRIPTS

pytestmark = pytest.mark.slow

GUARD_SCRIPTS = SCRIPTS / "guard"


def run_script(tmp: Path, name: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run a script of tests/scripts/guard/ in ``tmp``; its output (it must exit 0)."""
    proc = subprocess.run(
        [sys.executable, str(GUARD_SCRIPTS / name), *args],
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def max_relative_difference(a: Path, b: Path) -> float:
    import torch

    left, right = torch.load(a), torch.load(b)
    assert left.keys() == right.keys()
    return max(float((left[k] - right[k]).abs().max() / right[k].abs().max().clamp_min(1e-12)) for k in left)


def test_a_micro_batch_without_tokens_adds_nothing_to_a_token_mean(tmp_path: Path) -> None:
    """Lowered from 8 to 2 at batch 1, the last micro-batch of each batch holds only samples whose labels are
    all -100: its token mean is 0/0. It counts for nothing (weight 0), and must not turn the step into NaN."""
    run_script(tmp_path, "sft_masked.py", "--out", "reference.pt", "--losses", "reference.jsonl")
    out = run_script(
        tmp_path, "sft_masked.py", "--guard", "--out", "guarded.pt", "--losses", "guarded.jsonl",
        env={"AUTOBATCH_GUARD_FAIL_AT": "1"},
    )  # fmt: skip
    assert "micro-batch lowered 8 -> 2" in out
    guarded = [json.loads(line)["loss"] for line in (tmp_path / "guarded.jsonl").read_text().splitlines()]
    reference = [json.loads(line)["loss"] for line in (tmp_path / "reference.jsonl").read_text().splitlines()]
    assert guarded == pytest.approx(reference, rel=1e-9)
    assert max_relative_difference(tmp_path / "guarded.pt", tmp_path / "reference.pt") <= 1e-9


def test_the_lists_a_collate_leaves_one_item_a_sample_are_split_with_the_tensors(tmp_path: Path) -> None:
    """The default collate leaves strings (the samples' source names, their files) as lists of one item per
    sample: a micro-batch takes its own samples' items, as it takes their rows."""
    run_script(tmp_path, "tagged_samples.py", "--out", "reference.pt")
    out = run_script(
        tmp_path, "tagged_samples.py", "--guard", "--out", "guarded.pt", env={"AUTOBATCH_GUARD_FAIL_AT": "1"}
    )
    assert "micro-batch lowered 16 -> 8" in out
    assert max_relative_difference(tmp_path / "guarded.pt", tmp_path / "reference.pt") <= 1e-9


def test_a_preempted_run_keeps_its_out_of_memory_evidence(tmp_path: Path) -> None:
    """SIGTERM ends a Python job without running its ``with`` blocks' exits (a scheduler's preemption, and how
    ``autobatch run`` forwards one): the lowering at batch 3 is in the key's evidence all the same."""
    import signal

    from autobatch.cache import CacheFolder, EvidenceStore

    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOBATCH_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [sys.executable, str(GUARD_SCRIPTS / "preemptible_job.py"), "--key", "k1"],
        cwd=tmp_path, env={**env, "AUTOBATCH_GUARD_FAIL_AT": "3"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "step 5":
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM, err[-2000:]
    assert "step 3: micro-batch lowered 8 -> 4" in err
    events = EvidenceStore(CacheFolder(str(tmp_path / "cache"))).read("k1")
    assert [(e.kind, e.step, e.micro_batch_size, e.new_micro_batch_size, e.reason) for e in events] == [
        ("change", 3, 8, 4, "out of memory")
    ]
    assert events[0].shapes == [[16, 32], [16, 1]]
